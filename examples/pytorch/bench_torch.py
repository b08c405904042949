"""What tpsprof.torch costs a real PyTorch training step.

Two copies of one model train side by side in this process: one bare, one
instrumented with tpsprof.torch.instrument (model, optimizer, data loader;
records sent to the agent at TPSPROF_SOCKET). Blocks of steps alternate
between them so that the machine's noise falls on both alike. Prints one
JSON object: median step time of each, the overhead (the median of the
differences between adjacent blocks) in percent and microseconds, and the
same on a near-empty step, which gives the per-step cost itself. Records
are built and sent by a thread of tpsprof's: the CPU time it spent per step
(``sender_us``) is reported beside the training thread's cost, and
``cost_us`` is the sum of both (an upper bound: on a machine with a free
core the sender runs beside training); ``self_us`` is what the profiler's
own clocks around its hooks say the training thread spent in them (the
records' capture_ns), to hold beside the paired difference.

    tpsprof launch --job bench -- python3 examples/pytorch/bench_torch.py
"""

import argparse
import json
import os
import statistics
import sys
import time

try:
    import tpsprof
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import tpsprof
import torch
import torch.nn as nn

import tpsprof.torch as tt


DEVICE = torch.device("cpu")


def make(dim, layers, vocab, seq, batch, steps):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=dim, nhead=4, dim_feedforward=4 * dim, batch_first=True)
    model = nn.Sequential(nn.Embedding(vocab, dim), nn.TransformerEncoder(layer, num_layers=layers), nn.Linear(dim, vocab)).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randint(0, vocab, (steps * batch, seq + 1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:]), batch_size=batch)
    return model, opt, loader


def run_block(model, opt, it, n, vocab):
    times = []
    for _ in range(n):
        t = time.perf_counter_ns()
        x, y = next(it)
        if DEVICE.type == "cuda":
            x, y = x.to(DEVICE, non_blocking=True), y.to(DEVICE, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()  # the step's GPU time in the host's clock
        times.append(time.perf_counter_ns() - t)
    return times


def compare(args, dim, layers, vocab, seq, batch, blocks, per_block):
    steps = blocks * per_block + 2
    bare = make(dim, layers, vocab, seq, batch, steps)
    inst = make(dim, layers, vocab, seq, batch, steps)
    prof = tt.instrument(inst[0], inst[1], inst[2])
    its = [iter(bare[2]), iter(inst[2])]
    run_block(bare[0], bare[1], its[0], 1, vocab)  # warm up both
    run_block(inst[0], inst[1], its[1], 1, vocab)
    tb, ti, diffs = [], [], []
    for b in range(blocks):
        order = (0, 1) if b % 2 == 0 else (1, 0)
        got = {}
        for k in order:
            m = bare if k == 0 else inst
            got[k] = run_block(m[0], m[1], its[k], per_block, vocab)
        tb.extend(got[0])
        ti.extend(got[1])
        # adjacent blocks share the machine's state: their difference is
        # far less noisy than the difference of two medians
        diffs.append(statistics.median(got[1]) - statistics.median(got[0]))
    prof.close()
    mb, mi, d = statistics.median(tb), statistics.median(ti), statistics.median(diffs)
    sender = prof._sender.cpu_ns / max(prof.steps, 1)
    own = prof.cost.total_ns / max(prof.steps, 1)  # what the profiler's own clocks say (the records' capture_ns)
    return {"bare_ms": mb / 1e6, "instrumented_ms": mi / 1e6, "overhead_pct": 100 * d / mb,
            "overhead_us": d / 1e3, "sender_us": sender / 1e3, "cost_us": (d + sender) / 1e3,
            "self_us": own / 1e3,
            # (TPSPROF_OWN_DETAIL=1) the training thread's cost by hook, µs a step
            "own_by_us": {k: round(v / max(prof.steps, 1) / 1e3, 2) for k, v in sorted(prof.cost.by.items())},
            "mark_calls": prof.mark_calls, "pairs": len(diffs), "steps_each": len(tb), "sent": prof.sent,
            "dropped": prof.dropped, "errors": prof.errors}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=60)
    p.add_argument("--per-block", type=int, default=1)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--device", default="cpu", help="cpu or cuda (each step synchronised to be timed)")
    p.add_argument("--only", choices=["model", "tiny"], help="one of the two comparisons")
    a = p.parse_args()
    global DEVICE
    DEVICE = torch.device(a.device)
    torch.set_num_threads(1)  # steadier timings on a shared machine
    out = {}
    if a.only != "tiny":
        out["model_step"] = compare(a, a.dim, a.layers, a.vocab, a.seq, a.batch, a.blocks, a.per_block)
    if a.only != "model":  # a near-empty step: the per-step cost itself
        out["tiny_step"] = compare(a, 8, 1, 16, 4, 1, 200, 10)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
