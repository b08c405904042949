"""A DDP job with one slow rank, for on-demand capture (tpsprof trace).

Every rank trains a small model and averages its gradients in one
all-reduce per step (gloo on CPU, NCCL on a GPU); rank --slow-rank does
--slow-ms of extra work before each backward, so the others wait for it
at the all-reduce. The job runs until the file --stop exists (or
--max-steps), measured by tpsprof.torch.instrument.

It logs its own truth to --truth/truth.<R>.jsonl, one line per step: its own
clock around its extra work, at its arrival at the all-reduce and at its
return (the ranks of one node share the clock).

    torchrun --nproc_per_node 4 examples/pytorch/straggler_train.py \\
        --slow-rank 2 --slow-ms 40 --stop /tmp/stop --truth /tmp/truth
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import tpsprof.torch


def busy(ms):
    """Extra computation of ms milliseconds (a spin: the rank is busy, not
    asleep, as a slow GPU or a hot CPU would be)."""
    end = time.perf_counter() + ms / 1e3
    x = torch.ones(64, 64)
    while time.perf_counter() < end:
        x = x @ x * 0.5


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=40.0)
    p.add_argument("--stop", required=True, help="the job ends once this file exists")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--truth", required=True, help="folder for the job's own measurements")
    a = p.parse_args()

    torch.set_num_threads(1)  # ranks sharing a few CPU cores do not also share them among threads
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    prof = tpsprof.torch.instrument(model, opt, tokens=lambda batch: 8 * 32)
    os.makedirs(a.truth, exist_ok=True)
    out = open(os.path.join(a.truth, "truth.%d.jsonl" % rank), "w")
    x = torch.randn(8, 256, device=dev)
    params = list(model.parameters())
    for step in range(a.max_steps):
        t0 = time.time_ns()
        loss = model(x).square().mean()
        s0 = time.time_ns()
        if rank == a.slow_rank:
            busy(a.slow_ms)
        s1 = time.time_ns()
        loss.backward()
        # the gradients averaged in one all-reduce, with the stop flag (every
        # rank stops after the same step); the job's own clock at its arrival
        stop = 1.0 if os.path.exists(a.stop) else 0.0
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [torch.tensor([stop], device=dev)])
        if dev.type == "cuda":
            torch.cuda.synchronize()
        arrive = time.time_ns()
        dist.all_reduce(flat)
        done = time.time_ns()
        i = 0
        for p in params:
            p.grad.copy_(flat[i:i + p.numel()].view_as(p) / world)
            i += p.numel()
        opt.step()
        opt.zero_grad()
        out.write(json.dumps({"rank": rank, "step": step, "start_unix_ns": t0, "arrive_unix_ns": arrive,
                              "done_unix_ns": done, "extra_ns": s1 - s0}) + "\n")
        if flat[-1].item() > 0:
            break
    out.close()
    prof.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
