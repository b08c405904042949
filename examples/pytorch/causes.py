"""A nanoGPT-style loop (no tpsprof call) with one cause of lost time
injected, to check that the report's top finding names it and that its
headroom is the speed-up the job gains without it.

    tpsprof launch --auto --job data -- torchrun --nproc_per_node 2 \\
        examples/pytorch/causes.py --cause data --iters 40

--cause:
  none          the job as it is (the speed-up's baseline)
  data          get_batch sleeps 30 ms on every rank (a slow input pipeline)
  slow-data     get_batch sleeps 30 ms on rank 1 alone
  slow-compute  rank 1's forward takes 30 ms more (a slow GPU, a noisy neighbour)
  throttle      the same, run as two nodes whose second node's GPU telemetry
                (simulated at the agent's NVML boundary) shows it throttled
  no-overlap    after the backward, a 16 MiB all-reduce the job waits for
  ckpt          a 64 MiB checkpoint (torch.save) every 2 iterations
  host          20 ms of Python on every rank after the optimizer step
  eval          every 4 iterations, 20 evaluation forwards under no_grad
  gc            automatic collection off; 200,000 objects in cycles collected each iteration
  pipeline      (PyTorch 2.4 and later) the model as two pipeline stages, one a rank, run by
                torch.distributed.pipelining's GPipe schedule with 2 micro-batches (few: a
                third of each step is the schedule's own bubble); its injected time is each
                rank's wait for the other stage by its own clock (the step without the
                bubble is the step less the smaller of the two ranks' waits)
  alloc         the same 200,000 objects without cycles (freed as they go): gc's baseline

The job writes its own truth to --truth DIR/truth.RANK.jsonl: each
iteration's start and end and the injected time on its own clock (the
sleeps, the all-reduce, the save, the evaluation, the collection, the
Python loop), from which the speed-up without the cause follows within
the run: period ÷ (period − the slowest rank's injected time) − 1.
"""

import argparse
import gc
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist

import nanogpt_train  # (beside this file: the same model)

CAUSES = ("none", "data", "slow-data", "slow-compute", "throttle", "no-overlap", "ckpt", "host", "eval", "gc", "alloc", "pipeline")


class GPT(nanogpt_train.GPT):
    """nanogpt_train's model, its forward slow by slow seconds (rank 1's)."""

    def __init__(self, vocab, dim, block, slow=0.0):
        super().__init__(vocab, dim, block)
        self.slow = slow
        self.injected = 0  # ns slept in forward since the job last read it

    def forward(self, idx, targets=None):
        if self.slow and self.training:
            s = time.time_ns()
            time.sleep(self.slow)
            self.injected += time.time_ns() - s
        return super().forward(idx, targets)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cause", choices=CAUSES, default="none")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--truth", default="")
    a = p.parse_args()
    c = a.cause
    if c in ("gc", "alloc"):
        gc.disable()
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(1337 + rank)
    vocab = 512
    data = torch.randint(0, vocab, (50000,), dtype=torch.long)
    delay = 0.03 if c == "data" or (c == "slow-data" and rank == 1) else 0.0

    slept = [0]

    def get_batch():
        if delay:
            s = time.time_ns()
            time.sleep(delay)
            slept[0] += time.time_ns() - s
        ix = torch.randint(len(data) - a.block, (a.batch,))
        x = torch.stack([data[i:i + a.block] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + a.block] for i in ix])
        return x, y

    out = None
    if a.truth:
        os.makedirs(a.truth, exist_ok=True)
        out = open(os.path.join(a.truth, "truth.%d.jsonl" % rank), "w")
    if c == "pipeline":
        pipeline(a, rank, get_batch, vocab, out)
        if out:
            out.close()
        dist.destroy_process_group()
        return
    model = GPT(vocab, a.dim, a.block, slow=0.03 if c in ("slow-compute", "throttle") and rank == 1 else 0.0)
    gpt = model
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    big = torch.zeros(4 << 20) if c == "no-overlap" else None  # 16 MiB of float32
    pad = torch.zeros(16 << 20) if c == "ckpt" else None  # 64 MiB beside the model's state
    ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    for it in range(a.iters):
        t0 = time.time_ns()
        x, y = get_batch()
        _, loss = model(x, y)
        loss.backward()
        injected = 0
        if big is not None:
            s = time.time_ns()
            dist.all_reduce(big)
            injected = time.time_ns() - s
        if c in ("gc", "alloc"):
            junk = [{} for _ in range(200000)]
            for d in junk:
                d["self"] = d if c == "gc" else None  # gc: a cycle, only the collector frees it
            del junk, d
        if c == "gc":
            s = time.time_ns()
            gc.collect(0)
            injected = time.time_ns() - s
        opt.step()
        opt.zero_grad(set_to_none=True)
        if c == "host":
            s = time.time_ns()
            while time.time_ns() - s < 20_000_000:
                sum(i * i for i in range(200))
            injected = time.time_ns() - s
        if c == "ckpt" and it % 2 == 1:
            s = time.time_ns()
            torch.save({"model": model.state_dict(), "pad": pad}, ckpt)
            injected = time.time_ns() - s
        if c == "eval" and it % 4 == 3:
            s = time.time_ns()
            model.eval()
            with torch.no_grad():
                for _ in range(20):
                    model(*get_batch())
            model.train()
            injected = time.time_ns() - s
        injected += slept[0] + gpt.injected  # the slow get_batch, the slow forward
        slept[0] = gpt.injected = 0
        if out:
            out.write(json.dumps({"iter": it, "tokens": a.batch * a.block, "start_ns": t0, "end_ns": time.time_ns(),
                                  "injected_ns": injected}) + "\n")
    if out:
        out.close()
    if distributed:
        dist.destroy_process_group()


class _Stage0(torch.nn.Module):
    """The first pipeline stage: the embeddings and the MLP block."""

    def __init__(self, gpt):
        super().__init__()
        self.wte, self.wpe, self.mlp = gpt.wte, gpt.wpe, gpt.mlp

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        return x + self.mlp(x)


class _Stage1(torch.nn.Module):
    """The second: the head."""

    def __init__(self, gpt):
        super().__init__()
        self.lm_head = gpt.lm_head

    def forward(self, x):
        return self.lm_head(x)


def pipeline(a, rank, get_batch, vocab, out):
    """Two stages, one a rank, under GPipe with 2 micro-batches; each
    iteration's truth line holds the rank's own wait for the other stage
    (its clock around the schedule's waits on its sends and receives)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
    from torch.distributed.pipelining import schedules as pp_schedules

    gpt = nanogpt_train.GPT(vocab, a.dim, a.block)
    mod = _Stage0(gpt) if rank == 0 else _Stage1(gpt)
    stage = PipelineStage(mod, rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2,
                             loss_fn=lambda logits, y: torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1)))
    waited = [0]
    inner = pp_schedules._wait_batch_p2p

    def timed(works):
        s = time.time_ns()
        try:
            return inner(works)
        finally:
            waited[0] += time.time_ns() - s
    pp_schedules._wait_batch_p2p = timed
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-3)
    for it in range(a.iters):
        t0 = time.time_ns()
        x, y = get_batch()
        waited[0] = 0
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if out:
            out.write(json.dumps({"iter": it, "tokens": a.batch * a.block, "start_ns": t0, "end_ns": time.time_ns(),
                                  "injected_ns": waited[0]}) + "\n")


if __name__ == "__main__":
    main()
