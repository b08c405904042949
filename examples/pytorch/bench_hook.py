"""Measures what the plain tpsprof API costs a training loop per step.

Prints one JSON object: the mean and p99 time of a bare loop iteration and
of one with prof.start()/prof.end() sending to the agent at TPSPROF_SOCKET
(or the default socket), in microseconds.

    python3 examples/pytorch/bench_hook.py --steps 20000
"""

import argparse
import json
import os
import sys
import time

try:
    import tpsprof
except ImportError:  # a checkout, not under tpsprof launch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import tpsprof


def measure(steps, body):
    times = []
    for s in range(steps):
        t = time.perf_counter_ns()
        body(s)
        times.append(time.perf_counter_ns() - t)
    times.sort()
    return sum(times) / len(times) / 1e3, times[int(0.99 * (len(times) - 1))] / 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20000)
    a = p.parse_args()
    prof = tpsprof.Profiler(job=os.environ.get("TPSPROF_JOB", "bench-hook"), rank=0, world_size=1)

    def bare(s):
        pass

    def hooked(s):
        prof.start(s)
        prof.end(tokens=4096, loss=1.0)

    measure(1000, hooked)  # warm up, connect
    bare_mean, bare_p99 = measure(a.steps, bare)
    hook_mean, hook_p99 = measure(a.steps, hooked)
    prof.close()
    print(json.dumps({"steps": a.steps, "bare_mean_us": bare_mean, "bare_p99_us": bare_p99,
                      "hook_mean_us": hook_mean, "hook_p99_us": hook_p99, "sent": prof.sent, "dropped": prof.dropped}))


if __name__ == "__main__":
    main()
