"""A nanoGPT-style loop, with no tpsprof call and no DataLoader.

    tpsprof launch --auto --job gpt -- torchrun --nproc_per_node 2 \\
        examples/pytorch/nanogpt_train.py --truth DIR

As nanoGPT's train.py does: batches are cut from one token array by a
function (get_batch: random offsets, targets shifted by one), the model's
forward takes (idx, targets) and returns (logits, loss), gradients
accumulate over --accum micro-batches under DDP's no_sync, and the
optimizer steps once an iteration. tpsprof counts the tokens from the
model's forward inputs (under launch --auto nothing is declared).

The job writes its own truth to DIR/truth.RANK.jsonl, one line an
iteration: its tokens (micro-batches × batch × block, what nanoGPT prints
as tokens per iteration divided by the world size), its start and end on
its own clock, and the time its get_batch calls before the first forward
took (data_ns) and of it the thread's CPU time (data_cpu_ns: building the
batch, host work; the rest the wait), and the time from its previous optimizer step's return
to its first forward (pre_ns: get_batch, zero_grad, the line written
here). --batch-delay makes get_batch slow (a token array read from
a slow disk); --fetch-first fetches each iteration's batch at its top, as
simple loops do (nanoGPT fetches the next one while the GPU works).
--gc-garbage N turns Python's automatic collection off and, after each
iteration's backward, leaves N objects in reference cycles and collects
them (the young generation), timing the collection on its own clock (gc_ns in the truth). Run
without torchrun it is one process with no process group.
"""

import argparse
import contextlib
import gc
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F


class GPT(nn.Module):
    def __init__(self, vocab, dim, block):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(block, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        logits = self.lm_head(x + self.mlp(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--accum", type=int, default=2, help="micro-batches an iteration (gradient accumulation)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--truth", required=True, help="folder for the job's own measurements")
    p.add_argument("--batch-delay", type=float, default=0.0, help="seconds each get_batch call sleeps")
    p.add_argument("--fetch-first", action="store_true", help="fetch each iteration's batch at its top")
    p.add_argument("--gc-garbage", type=int, default=0, metavar="N",
                   help="objects left in reference cycles and collected after each backward (automatic collection off)")
    a = p.parse_args()
    if a.gc_garbage:
        gc.disable()

    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(1337 + rank)
    vocab = 97
    data = torch.randint(0, vocab, (20000,), dtype=torch.long)  # the token array (train.bin)

    def get_batch():
        if a.batch_delay:
            time.sleep(a.batch_delay)
        ix = torch.randint(len(data) - a.block, (a.batch,))
        x = torch.stack([data[i:i + a.block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + a.block] for i in ix])
        return x, y

    model = GPT(vocab, 32, a.block)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    os.makedirs(a.truth, exist_ok=True)
    out = open(os.path.join(a.truth, "truth.%d.jsonl" % rank), "w")
    if not a.fetch_first:
        x, y = get_batch()
    stepped = None  # when the last optimizer step returned
    for it in range(a.iters):
        t0 = time.time_ns()
        data_ns = data_cpu_ns = 0
        if a.fetch_first:
            c0 = time.thread_time_ns()
            x, y = get_batch()
            data_ns = time.time_ns() - t0
            data_cpu_ns = time.thread_time_ns() - c0
        pre_ns = None
        gc_ns = 0
        for micro in range(a.accum):
            sync = micro == a.accum - 1 or not distributed
            with contextlib.nullcontext() if sync else model.no_sync():
                if micro == 0 and stepped is not None:
                    pre_ns = time.time_ns() - stepped
                _, loss = model(x, y)
                loss = loss / a.accum
            if not a.fetch_first or micro < a.accum - 1:
                x, y = get_batch()  # the next micro-batch, as nanoGPT fetches it while the GPU works
            loss.backward()
        if a.gc_garbage:
            junk = [{} for _ in range(a.gc_garbage)]
            for d in junk:
                d["self"] = d  # a cycle: only the collector frees it
            del junk, d
            g0 = time.perf_counter_ns()
            gc.collect(0)  # the young generation: what the iteration left
            gc_ns = time.perf_counter_ns() - g0
        opt.step()
        stepped = time.time_ns()
        opt.zero_grad(set_to_none=True)
        out.write(json.dumps({"iter": it, "tokens": a.accum * a.batch * a.block, "start_ns": t0, "end_ns": time.time_ns(),
                              "data_ns": data_ns, "data_cpu_ns": data_cpu_ns, "pre_ns": pre_ns, "gc_ns": gc_ns}) + "\n")
    out.close()
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
