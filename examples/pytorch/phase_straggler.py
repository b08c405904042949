"""A DDP job (several gradient buckets) whose slow rank is late in one phase
at a time, for checking what tpsprof trace names.

    torchrun --nproc_per_node 4 examples/pytorch/phase_straggler.py \\
        --slow-rank 3 --delay-ms 40 --stop /tmp/stop --truth /tmp/truth

Every rank trains the same model under DistributedDataParallel with small
buckets (its gradients are averaged in several all-reduces fired during
backward), its batches from a DataLoader, measured by
tpsprof.torch.instrument. Rank --slow-rank spends --delay-ms more in one
phase of each step, the phase changing every --per-phase steps in the
order of --phases:

  data       its dataset takes longer to read the batch (slow storage);
  forward    a layer takes longer in the forward pass;
  backward   the first gradient computed (before any bucket is ready) takes longer;
  optimizer  its optimizer step takes longer;
  host       host code between the batch and the forward (preprocessing).

The rank sleeps through its delay (a rank slow on its own device leaves the
others' cores alone; with more ranks than cores, --spin would slow them
too and they would wait less than the delay).

The others wait for it at the step's first all-reduce (after an optimizer
delay, at the next step's). The job runs until the file --stop exists (or
--max-steps): rank 0 then names a step a few ahead at which every rank
stops, through a file beside the truth. It logs its own truth to --truth/truth.<R>.jsonl, one line a
step: the step (as tpsprof numbers it), the phase and the extra time it
spent there on its own clock (0 on the other ranks), and its arrivals at
the step's bucket all-reduces (a DDP communication hook around DDP's own
all-reduce: the ranks of one node share the clock; none with --fsdp2).
With --pair-groups each step also begins with an all-reduce in the rank's
pair's process group (a second group kind), its arrival logged too; the
slow rank's optimizer delay, the one phase before it, then makes its pair
partner wait there instead of at the buckets.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import tpsprof.torch

PHASES = ("data", "forward", "backward", "optimizer", "host")


def busy(ms):
    """ms milliseconds of computation (the rank is busy, not asleep)."""
    end = time.perf_counter() + ms / 1e3
    x = torch.ones(64, 64)
    while time.perf_counter() < end:
        x = x @ x * 0.5


class Plan:
    """Which phase is slow at which step, and the extra time the job spent
    there at the current step (its own clock)."""

    def __init__(self, a, rank):
        self.slow = rank == a.slow_rank
        self.ms, self.per, self.phases, self.spin = a.delay_ms, a.per_phase, a.phases, a.spin
        self.step, self.extra_ns = 0, 0
        self.arrivals = []  # this step's arrivals at its gradient buckets' all-reduces

    def phase(self, step=None):
        s = self.step if step is None else step
        return self.phases[(s // self.per) % len(self.phases)]

    def delay(self, phase):
        if self.slow and self.phase() == phase:
            t0 = time.perf_counter_ns()
            if self.spin:
                busy(self.ms)
            else:
                time.sleep(self.ms / 1e3)
            self.extra_ns += time.perf_counter_ns() - t0


class Samples(Dataset):
    def __init__(self, plan, n=1 << 20):
        self.plan, self.n = plan, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i % 8 == 0:  # once a batch of 8 (the sampler is sequential)
            self.plan.delay("data")
        g = torch.Generator().manual_seed(i)
        return torch.randn(512, generator=g)


class SlowGrad(torch.autograd.Function):
    """Identity whose backward is the first computed: the slow rank's
    backward delay comes before any gradient bucket is ready."""

    @staticmethod
    def forward(ctx, x, plan):
        ctx.plan = plan
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.plan.delay("backward")
        return g, None


class Net(torch.nn.Module):
    def __init__(self, plan):
        super().__init__()
        self.plan = plan
        self.layers = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(4))

    def forward(self, x):
        self.plan.delay("forward")
        for layer in self.layers:
            x = torch.relu(layer(x))
        return SlowGrad.apply(x, self.plan)


class SlowSGD(torch.optim.SGD):
    def __init__(self, params, plan, **kw):
        super().__init__(params, **kw)
        self.plan = plan

    def step(self, closure=None):
        out = super().step(closure)
        self.plan.delay("optimizer")
        return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--delay-ms", type=float, default=40.0)
    p.add_argument("--spin", action="store_true",
                   help="compute through the delay instead of sleeping (with more ranks than cores it slows the others too)")
    p.add_argument("--fsdp2", action="store_true",
                   help="FSDP2 (fully_shard on each layer and the root) instead of DDP; no arrivals are logged")
    p.add_argument("--pair-groups", action="store_true",
                   help="also a second kind of process group: ranks in pairs (0,1), (2,3), ... each reduce a "
                        "small tensor in their pair's group at the start of every step, before its batch "
                        "(a tensor-parallel group's per-step reduction); its arrivals are logged")
    p.add_argument("--per-phase", type=int, default=20, help="steps before the slow phase changes")
    p.add_argument("--phases", type=lambda s: tuple(s.split(",")), default=PHASES,
                   help="comma-separated, of " + ",".join(PHASES))
    p.add_argument("--stop", required=True, help="the job ends once this file exists")
    p.add_argument("--max-steps", type=int, default=5000)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the ranks share the GPU (gloo moves CUDA tensors)")
    p.add_argument("--truth", required=True, help="folder for the job's own measurements")
    a = p.parse_args()
    if not a.phases or any(x not in PHASES for x in a.phases):
        p.error("--phases: give some of " + ",".join(PHASES))

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plan = Plan(a, rank)
    pair = None
    if a.pair_groups:
        world = dist.get_world_size()
        for r in range(0, world - 1, 2):  # every rank creates every group, in the same order
            g = dist.new_group([r, r + 1])
            if rank in (r, r + 1):
                pair = g
    torch.manual_seed(0)
    # 4 MiB of fp32 gradients in 1 MiB buckets: four all-reduces a step,
    # fired as backward reaches each bucket
    if a.fsdp2:
        # FSDP2 (torch >= 2.6): each layer's parameters all-gathered
        # before its forward and backward, its gradients reduce-scattered
        from torch.distributed.fsdp import fully_shard
        model = Net(plan)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        dev = torch.device(a.device)
        ids = [dev.index or 0] if dev.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(Net(plan).to(dev), device_ids=ids, bucket_cap_mb=1)
        # DDP's own all-reduce, with the job's clock at the rank's arrival
        # at each bucket's
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def timed_allreduce(state, bucket):
            plan.arrivals.append(time.time_ns())
            return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(None, timed_allreduce)
    opt = SlowSGD(model.parameters(), plan, lr=1e-4)
    loader = DataLoader(Samples(plan), batch_size=8)
    prof = tpsprof.torch.instrument(model, opt, loader)
    os.makedirs(a.truth, exist_ok=True)
    out = open(os.path.join(a.truth, "truth.%d.jsonl" % rank), "w")
    stop_at = os.path.join(a.truth, "stop_at")  # rank 0's decision, read by all
    end = a.max_steps
    it = iter(loader)
    step = 0
    while step < end:
        plan.step, plan.extra_ns, plan.arrivals = step, 0, []
        t0 = time.time_ns()
        pair_arrive = []
        if pair is not None:
            pair_arrive.append(time.time_ns())
            dist.all_reduce(torch.ones(16), group=pair)
        x = next(it).to(a.device)
        plan.delay("host")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.write(json.dumps({"rank": rank, "step": step, "phase": plan.phase(), "extra_ns": plan.extra_ns,
                              "arrive_unix_ns": plan.arrivals, "pair_arrive_unix_ns": pair_arrive, "start_unix_ns": t0, "end_unix_ns": time.time_ns()}) + "\n")
        out.flush()
        # every rank stops after the same step, without a collective of its
        # own between steps (it would be where the others wait): rank 0
        # names a step 5 ahead (the ranks are at most a step apart)
        if rank == 0 and end == a.max_steps and os.path.exists(a.stop):
            with open(stop_at + ".tmp", "w") as f:
                f.write(str(step + 5))
            os.replace(stop_at + ".tmp", stop_at)
        if end == a.max_steps and os.path.exists(stop_at):
            with open(stop_at) as f:
                end = min(int(f.read()), a.max_steps)
        step += 1
    out.close()
    prof.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
