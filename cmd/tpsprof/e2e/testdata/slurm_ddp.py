"""A DDP job as srun scripts write it: each task one rank, its rank and the
world size from srun's SLURM_PROCID and SLURM_NTASKS (or RANK and
WORLD_SIZE under torchrun), the process group met at a file (--store).
Measured by tpsprof.torch.instrument(); it logs its own truth (--truth
DIR: a JSON line per step and rank, the tokens it trained on and its own
clock at the step's end). --hold: the first attempt (no
SLURM_RESTART_COUNT yet) keeps stepping slowly until it is stopped (a
requeue's SIGTERM); a requeued one runs its --steps and ends."""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import tpsprof.torch

p = argparse.ArgumentParser()
p.add_argument("--truth", required=True)
p.add_argument("--store", required=True)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--hold", action="store_true")
a = p.parse_args()
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))
attempt = int(os.environ.get("SLURM_RESTART_COUNT", 0) or 0)
dist.init_process_group("gloo", init_method="file://%s.%d" % (a.store, attempt), rank=rank, world_size=world)
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
prof = tpsprof.torch.instrument(model, opt)
os.makedirs(a.truth, exist_ok=True)
out = open(os.path.join(a.truth, "truth.%d.%d.jsonl" % (attempt, rank)), "a")
step = 0
while step < a.steps or (a.hold and attempt == 0):
    x = torch.randint(0, 64, (4, 16))
    prof.add_tokens(x.numel())
    loss = nn.functional.cross_entropy(model(x).reshape(-1, 64), x.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    out.write(json.dumps({"attempt": attempt, "step": step, "rank": rank, "tokens": x.numel(), "end": time.time_ns()}) + "\n")
    out.flush()
    step += 1
    time.sleep(0.2 if a.hold and attempt == 0 else 0.02)
prof.close()
dist.destroy_process_group()
print("slurm job rank %d of %d done" % (rank, world), flush=True)
