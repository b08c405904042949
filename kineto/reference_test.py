"""An independent implementation of the per-step overlap and exposed
communication, straight from the trace JSON with the standard library, for
kineto_test.go to compare with: kernels belong to the step whose span holds
their launch (runtime event with the same correlation id); communication =
kernels whose name contains "nccl"; computation = other kernels.

    python3 reference_test.py TRACE.json.gz  ->  {"<step>": [overlap_pct, exposed_us], ...}
"""
import gzip
import json
import sys


def merged(iv):
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap(a, b):
    i = j = 0
    t = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            t += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return t


def main(path):
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"], e["name"].split("#")[1]) for e in events
             if e.get("name", "").startswith("ProfilerStep#")]
    launch = {e["args"]["correlation"]: e["ts"] for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out = {}
    for lo, hi, n in steps:
        comp, comm = [], []
        for e in events:
            if e.get("cat") != "kernel":
                continue
            t = launch.get(e["args"].get("correlation"))
            if t is None or not lo <= t < hi:
                continue
            (comm if "nccl" in e["name"] else comp).append((e["ts"], e["ts"] + e["dur"]))
        c, m = merged(comp), merged(comm)
        total = sum(b - a for a, b in m)
        ov = overlap(m, c)
        out[n] = [100 * ov / total if total else None, total - ov]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
