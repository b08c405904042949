"""A DDP job that runs its own scheduled torch.profiler the whole time, for
the capture beside it (tpsprof trace answers busy, never crashes the job or
empties its trace).

Every rank trains a small model, averages its gradients in one all-reduce a
step (gloo on CPU, NCCL on a GPU) and steps its own
``torch.profiler.profile(schedule=schedule(wait=1, warmup=1, active=2))``
every iteration, cycling until the file --stop exists. Each of its traces is
exported to --traces/own.<rank>.<n>.json; the job logs its own truth, one
line per trace it exported, to --truth/truth.<rank>.jsonl: the file and the
number of events the profiler handed it.

    torchrun --nproc_per_node 2 examples/pytorch/own_profiler_train.py \\
        --stop /tmp/stop --traces /tmp/traces --truth /tmp/truth
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

import tpsprof.torch


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stop", required=True, help="the job ends once this file exists")
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--traces", required=True, help="folder for the job's own traces")
    p.add_argument("--truth", required=True, help="folder for the job's own log")
    a = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    prof = tpsprof.torch.instrument(model, opt, tokens=lambda batch: 8 * 32)
    os.makedirs(a.traces, exist_ok=True)
    os.makedirs(a.truth, exist_ok=True)
    out = open(os.path.join(a.truth, "truth.%d.jsonl" % rank), "w")
    exported = [0]

    def ready(p):
        path = os.path.join(a.traces, "own.%d.%d.json" % (rank, exported[0]))
        exported[0] += 1
        p.export_chrome_trace(path)
        out.write(json.dumps({"rank": rank, "trace": path, "events": len(p.events())}) + "\n")
        out.flush()

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    own = profile(activities=acts, schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=ready)
    own.start()
    x = torch.randn(8, 128, device=dev)
    params = list(model.parameters())
    for step in range(a.max_steps):
        loss = model(x).square().mean()
        loss.backward()
        stop = 1.0 if os.path.exists(a.stop) else 0.0
        flat = torch.cat([q.grad.reshape(-1) for q in params] + [torch.tensor([stop], device=dev)])
        dist.all_reduce(flat)
        i = 0
        for q in params:
            q.grad.copy_(flat[i:i + q.numel()].view_as(q) / world)
            i += q.numel()
        opt.step()
        opt.zero_grad()
        own.step()
        if flat[-1].item() > 0:
            break
    own.stop()
    out.close()
    prof.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
