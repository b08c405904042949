"""A runnable training loop measured by tpsprof.

With PyTorch it trains a small transformer language model on random tokens
(on the GPU when there is one, else on the CPU), instrumented with one call,
``tpsprof.torch.instrument``: data wait, forward, backward, optimizer,
communication (under torchrun: DDP over gloo or NCCL) and tokens are
measured, not hand-timed. Without PyTorch (or with --synthetic) it times a
synthetic loop with the plain API.

    tpsprof launch --job demo-train --nats nats://127.0.0.1:4222 -- python3 examples/pytorch/train.py --steps 50
    tpsprof launch --job demo-ddp --nats nats://127.0.0.1:4222 -- torchrun --nproc_per_node 2 examples/pytorch/train.py

``tpsprof launch`` puts the tpsprof package on PYTHONPATH; run from a
checkout without it, this script finds the package in ../../python.
"""

import argparse
import os
import sys
import time

try:
    import tpsprof
except ImportError:  # a checkout, not under tpsprof launch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import tpsprof


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=8, help="sequences per step and rank")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--data-sleep", type=float, default=0.0, help="seconds each batch takes to load (a slow data loader)")
    p.add_argument("--crash-at", type=int, default=-1,
                   help="rank 0 of the first torchrun attempt exits at this step (to test elastic restarts)")
    p.add_argument("--synthetic", action="store_true", help="skip PyTorch even if installed")
    p.add_argument("--same-batches", action="store_true",
                   help="every rank reads the same batches (no DistributedSampler): the agent warns that "
                        "replicas trained on identical data")
    args = p.parse_args()
    try:
        import torch  # noqa: F401
        have_torch = not args.synthetic
    except ImportError:
        have_torch = False
    if have_torch:
        train_torch(args)
    else:
        train_synthetic(args)


def train_synthetic(args):
    prof = tpsprof.Profiler()
    tokens = args.batch * args.seq
    for step in range(args.steps):
        prof.start(step)
        with prof.phase("data_wait"):
            time.sleep(0.0005 + args.data_sleep)
        with prof.phase("fwd"):
            sum(i * i for i in range(2000))
        with prof.phase("bwd"):
            sum(i * i for i in range(4000))
        prof.end(tokens=tokens, loss=10.0 / (step + 1))
    prof.close()
    print("tpsprof: %d steps sent, %d dropped (socket %s)" % (prof.sent, prof.dropped, prof.path))


class RandomTokens:
    """Random token sequences (inputs, next-token labels); each item takes
    data_sleep/batch seconds to load."""

    def __init__(self, n, seq, vocab, data_sleep, batch):
        self.n, self.seq, self.vocab, self.sleep = n, seq, vocab, data_sleep / max(batch, 1)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        if self.sleep:
            time.sleep(self.sleep)
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        return x[:-1], x[1:]


def train_torch(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import tpsprof.torch

    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if distributed:
        dist.init_process_group("nccl" if dev == "cuda" else "gloo")
        if dev == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    vocab, d = args.vocab, args.dim
    layer = nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=4 * d, batch_first=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(vocab, d), nn.TransformerEncoder(layer, num_layers=2), nn.Linear(d, vocab)).to(dev)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    start = 0
    if args.crash_at >= 0 and restart > 0:
        start = args.crash_at // 2  # resume from an (imagined) checkpoint before the crash
    shards = int(os.environ["WORLD_SIZE"]) if distributed and not args.same_batches else 1
    per_step = args.batch * shards  # sequences a step takes across the replicas
    data = RandomTokens(args.steps * per_step, args.seq, vocab, args.data_sleep, args.batch)
    data = torch.utils.data.Subset(data, range(start * per_step, len(data)))
    # Each replica its own share of the data (without the sampler every rank
    # reads the same batches: --same-batches shows the warning that draws).
    sampler = None
    if shards > 1:
        sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False, drop_last=True)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, sampler=sampler)
    # One call: the model, the optimizer (its step ends each step) and the loader.
    prof = tpsprof.torch.instrument(model, opt, loader, first_step=start)
    for step, (x, y) in enumerate(loader, start):
        if args.crash_at >= 0 and restart == 0 and step == args.crash_at and int(os.environ.get("RANK", 0)) == 0:
            prof.close()
            # dies a moment into the step: torchrun then stops the other
            # ranks with SIGTERM at once (0.1 s on current torch), and a
            # rank stopped so loses the records its sender (every 50 ms)
            # had not yet written: the test's steps take milliseconds
            time.sleep(0.5)
            os._exit(3)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    prof.close()
    print("tpsprof: rank %s attempt %d: %d steps sent, %d dropped, %d errors" % (
        os.environ.get("RANK", "0"), prof.client.attempt, prof.steps, prof.dropped, prof.errors))
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
