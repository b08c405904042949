"""Parallel training loops of current PyTorch, measured by tpsprof and by themselves.

    torchrun --nproc_per_node 2 examples/pytorch/parallel_train.py --mode fsdp2 --truth DIR

Modes (CPU and gloo work; a GPU is used when there is one):
  ddp-compile    torch.compile(DDP(model))
  fsdp2          fully_shard on every block and the root
  fsdp2-compile  the same, compiled
  tp             tensor parallel through DTensor (parallelize_module, colwise then rowwise)
  fsdp2-tp       2-D: a (dp, tp) mesh, tensor parallel inside each pair of ranks and
                 FSDP2 across them (4 ranks: 2 replicas of 2)
  pp             two pipeline stages by hand: blocking send/recv of activations and
                 gradients, --micro micro-batches per step (GPipe order)
  pp-gpipe       two stages with torch.distributed.pipelining (PipelineStage,
  pp-1f1b        ScheduleGPipe or Schedule1F1B), --micro micro-batches per step

The model is instrumented with one call (tpsprof.torch.instrument). Independently of
tpsprof, every step is also profiled by the job itself with torch.profiler and the job
writes its own truth to DIR/truth.RANK.jsonl, one line per step: communication as the
union of the process group backend's own events ("gloo:*", "nccl:*"), the time it
blocked in sends to and receives from the other stage by its own clock (with pipelining:
around the library's own waits on its batched sends and receives), and the tokens it
trained on.
"""

import argparse
import json
import os
import sys
import time

try:
    import tpsprof.torch  # noqa: F401
except ImportError:  # a checkout, not under tpsprof launch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

import tpsprof.torch


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class LM(nn.Module):
    def __init__(self, vocab, dim, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def union_us(spans):
    total, end = 0.0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def instrument(args, model, opt, loader):
    """tpsprof.torch.instrument, or in zero-code mode the profiler the
    first optimizer made (nothing to call)."""
    if args.auto:
        prof = tpsprof.torch.active()
        if prof is None:
            raise SystemExit("--auto: no zero-code profiler (run under tpsprof launch --auto)")
        return prof
    return tpsprof.torch.instrument(model, opt, loader)


def backend_comm_ns(prof):
    """The union of the communication backend's own events (gloo runs each
    collective on a thread of its own and records it there)."""
    spans = []
    for e in prof.events():
        if e.name.startswith("gloo:") or e.name.startswith("nccl:"):
            spans.append((e.time_range.start, e.time_range.end))
    return int(union_us(spans) * 1000)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=["ddp-compile", "fsdp2", "fsdp2-compile", "tp", "fsdp2-tp", "pp", "pp-gpipe", "pp-1f1b"])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--micro", type=int, default=4, help="micro-batches per step (pp)")
    p.add_argument("--stage-sleep", type=float, default=0.0, help="seconds of extra work per micro-batch on the last stage (pp)")
    p.add_argument("--truth", required=True, help="folder for the job's own measurements")
    p.add_argument("--auto", action="store_true",
                   help="no instrument() call: run under `tpsprof launch --auto` (zero-code mode)")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = LM(args.vocab, args.dim, args.layers)
    same_data = args.mode in ("tp", "pp", "pp-gpipe", "pp-1f1b")  # ranks of one replica see the same batch
    replica = 0 if same_data else rank
    if args.mode == "fsdp2-tp":
        replica = rank // 2  # the (dp, tp) mesh is row-major: ranks 0-1 are replica 0
    g = torch.Generator().manual_seed(1234 + replica)
    # (inputs, targets) pairs: the tokens trained on are the targets
    seqs = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g) for _ in range(args.steps)]
    data = [(s[:, :-1].contiguous(), s[:, 1:].contiguous()) for s in seqs]
    loader = torch.utils.data.DataLoader(data, batch_size=None)

    if args.mode == "pp":
        return run_pp(args, model, loader, rank)
    if args.mode.startswith("pp-"):
        return run_pipelining(args, model, loader, rank)
    if args.mode == "ddp-compile":
        model = torch.compile(nn.parallel.DistributedDataParallel(model))
    elif args.mode in ("fsdp2", "fsdp2-compile"):
        from torch.distributed.fsdp import fully_shard
        for b in model.blocks:
            fully_shard(b)
        fully_shard(model)
        if args.mode == "fsdp2-compile":
            model = torch.compile(model)
    elif args.mode == "fsdp2-tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        for b in model.blocks:
            parallelize_module(b, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
            fully_shard(b, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    elif args.mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        for b in model.blocks:
            parallelize_module(b, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prof = instrument(args, model, opt, loader)
    out = open(os.path.join(args.truth, "truth.%d.jsonl" % rank), "w")
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    it = iter(loader)
    while True:
        with profile(activities=[ProfilerActivity.CPU]) as tp:
            t0 = time.perf_counter_ns()
            try:
                batch = next(it)
            except StopIteration:
                break
            ids, labels = batch
            logits = model(ids)
            loss = loss_fn(logits.reshape(-1, args.vocab), labels.reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            t1 = time.perf_counter_ns()
        out.write(json.dumps({"step": step, "rank": rank, "comm_ns": backend_comm_ns(tp), "pp_wait_ns": 0,
                              "tokens": ids.numel(), "step_ns": t1 - t0}) + "\n")
        step += 1
    out.close()
    prof.close()
    print("rank %d: %d steps sent, %d dropped, %d errors, c10d ops hooked: %d, topology %s" % (
        rank, prof.steps, prof.dropped, prof.errors, len(tpsprof.torch._c10d.ops), prof.topology), flush=True)
    dist.destroy_process_group()


def run_pp(args, model, loader, rank):
    """Two stages: rank 0 holds the embedding and the first half of the
    blocks, rank 1 the rest and the head. GPipe order: every micro-batch
    forward, then every backward."""
    half = len(model.blocks) // 2
    if rank == 0:
        stage = nn.Sequential(model.emb, *model.blocks[:half])
    else:
        stage = nn.Sequential(*model.blocks[half:], model.head)
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-3)
    prof = instrument(args, stage, opt, loader)
    out = open(os.path.join(args.truth, "truth.%d.jsonl" % rank), "w")
    loss_fn = nn.CrossEntropyLoss()
    mb = args.batch // args.micro
    shape = (mb, args.seq, args.dim)
    step = 0
    it = iter(loader)
    while True:
        with profile(activities=[ProfilerActivity.CPU]) as tp:
            t0 = time.perf_counter_ns()
            try:
                batch = next(it)
            except StopIteration:
                break
            ids, labels = batch
            waited = 0
            acts, outs = [], []
            for m in range(args.micro):
                if rank == 0:
                    y = stage(ids[m * mb:(m + 1) * mb])
                    w0 = time.perf_counter_ns()
                    dist.send(y.detach().contiguous(), 1)
                    waited += time.perf_counter_ns() - w0
                    outs.append(y)
                else:
                    x = torch.empty(shape)
                    w0 = time.perf_counter_ns()
                    dist.recv(x, 0)
                    waited += time.perf_counter_ns() - w0
                    x.requires_grad_()
                    if args.stage_sleep:
                        time.sleep(args.stage_sleep)
                    logits = stage(x)
                    loss = loss_fn(logits.reshape(-1, args.vocab), labels[m * mb:(m + 1) * mb].reshape(-1))
                    acts.append((x, loss))
            for m in range(args.micro):
                if rank == 0:
                    gr = torch.empty(shape)
                    w0 = time.perf_counter_ns()
                    dist.recv(gr, 1)
                    waited += time.perf_counter_ns() - w0
                    outs[m].backward(gr)
                else:
                    x, loss = acts[m]
                    loss.backward()
                    w0 = time.perf_counter_ns()
                    dist.send(x.grad.contiguous(), 0)
                    waited += time.perf_counter_ns() - w0
            opt.step()
            opt.zero_grad()
            t1 = time.perf_counter_ns()
        out.write(json.dumps({"step": step, "rank": rank, "comm_ns": backend_comm_ns(tp), "pp_wait_ns": waited,
                              "tokens": ids.numel(), "step_ns": t1 - t0}) + "\n")
        step += 1
    out.close()
    prof.close()
    print("rank %d: %d steps sent, %d dropped, %d errors, c10d ops hooked: %d" % (
        rank, prof.steps, prof.dropped, prof.errors, len(tpsprof.torch._c10d.ops)), flush=True)
    dist.destroy_process_group()


class _Stage0(nn.Module):
    def __init__(self, model, half):
        super().__init__()
        self.emb = model.emb
        self.blocks = nn.ModuleList(model.blocks[:half])

    def forward(self, ids):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return x


class _Stage1(nn.Module):
    def __init__(self, model, half):
        super().__init__()
        self.blocks = nn.ModuleList(model.blocks[half:])
        self.head = model.head

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def run_pipelining(args, model, loader, rank):
    """Two stages run by torch.distributed.pipelining's own schedule (GPipe
    or 1F1B). The job's truth for its wait on the other stage is its own
    clock around the library's waits on batched receives."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from torch.distributed.pipelining import schedules as pp_schedules

    half = len(model.blocks) // 2
    stage_mod = _Stage0(model, half) if rank == 0 else _Stage1(model, half)
    stage = PipelineStage(stage_mod, rank, 2, torch.device("cpu"))
    loss_fn = nn.CrossEntropyLoss()

    def loss_of(logits, labels):
        return loss_fn(logits.reshape(-1, args.vocab), labels.reshape(-1))
    cls = ScheduleGPipe if args.mode == "pp-gpipe" else Schedule1F1B
    schedule = cls(stage, n_microbatches=args.micro, loss_fn=loss_of)
    waited = [0]
    inner_wait = pp_schedules._wait_batch_p2p

    def timed_wait(works):
        t = time.perf_counter_ns()
        try:
            return inner_wait(works)
        finally:
            if stage_sleep_done[0] is not None:
                waited[0] += time.perf_counter_ns() - t
    stage_sleep_done = [None]
    pp_schedules._wait_batch_p2p = timed_wait
    if rank == 1 and args.stage_sleep:
        def slow(mod, inp):
            time.sleep(args.stage_sleep)
        stage_mod.register_forward_pre_hook(slow)
    opt = torch.optim.AdamW(stage_mod.parameters(), lr=1e-3)
    prof = instrument(args, stage_mod, opt, loader)
    out = open(os.path.join(args.truth, "truth.%d.jsonl" % rank), "w")
    step = 0
    it = iter(loader)
    while True:
        with profile(activities=[ProfilerActivity.CPU]) as tp:
            t0 = time.perf_counter_ns()
            try:
                ids, labels = next(it)
            except StopIteration:
                break
            waited[0] = 0
            stage_sleep_done[0] = True
            if rank == 0:
                schedule.step(ids)
            else:
                schedule.step(target=labels)
            opt.step()
            opt.zero_grad()
            t1 = time.perf_counter_ns()
        out.write(json.dumps({"step": step, "rank": rank, "comm_ns": backend_comm_ns(tp), "pp_wait_ns": waited[0],
                              "tokens": ids.numel(), "step_ns": t1 - t0}) + "\n")
        step += 1
    out.close()
    prof.close()
    print("rank %d: %d steps sent, %d dropped, %d errors, c10d ops hooked: %d, topology %s" % (
        rank, prof.steps, prof.dropped, prof.errors, len(tpsprof.torch._c10d.ops), prof.topology), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
