"""Training loops as jobs write them, measured by tpsprof and by themselves.

    torchrun --nproc_per_node 2 examples/pytorch/loops_train.py --truth DIR [--auto]

One loop with what real jobs do around the step (CPU and gloo work):
  - two optimizers (SGD for the body, AdamW for the embedding) and an LR
    scheduler, zero_grad at the top of each iteration;
  - every --skip-every-th iteration (counting from 1) the gradients are made
    non-finite and, as a grad scaler does, the job checks them and skips its
    optimizer steps;
  - every --eval-every iterations, an evaluation over a second loader
    (model.eval(), no gradients), and every --ckpt-every iterations a
    torch.save of the model and both optimizers;
  - --resume DIR loads the optimizers' state saved by an earlier run (whose
    first parameter, the frozen positional table, has no optimizer state)
    and numbers on where it left off.

By default the loop is instrumented with one call
(tpsprof.torch.instrument(model, [opt1, opt2], loader)); with --auto it has
no tpsprof call at all (run it under `tpsprof launch --auto`). Independently
of tpsprof the job writes its own truth to DIR/truth.RANK.jsonl: per
iteration its start (before fetching the batch) and end (after its last
optimizer step) on its own clock, whether it skipped, its tokens and loss;
per evaluation and checkpoint their start and end.
"""

import argparse
import json
import os
import sys
import time

AUTO = "--auto" in sys.argv
if not AUTO:
    try:
        import tpsprof.torch  # noqa: F401
    except ImportError:  # a checkout, not under tpsprof launch
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch
import torch.distributed as dist
import torch.nn as nn


class LM(nn.Module):
    def __init__(self, vocab, dim, seq):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02, requires_grad=False)  # frozen, first
        self.emb = nn.Embedding(vocab, dim)
        self.body = nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        return self.head(x + self.body(x))


class SlowFile:
    """A file whose writes take their share of `seconds` (a slow or remote
    file system), the last of it on close: what torch.save writes into."""

    def __init__(self, path, seconds):
        self.f = open(path, "wb")
        self.seconds = seconds

    def write(self, b):
        time.sleep(self.seconds / 4 / 64)  # a quarter spread over the writes
        return self.f.write(b)

    def flush(self):
        self.f.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        time.sleep(self.seconds * 3 / 4)  # the rest as the file closes (its data reaching the disk)
        self.f.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--skip-every", type=int, default=5, help="every Nth iteration skips its optimizer steps (0: never)")
    p.add_argument("--eval-every", type=int, default=4, help="evaluate after every Nth iteration (0: never)")
    p.add_argument("--eval-batches", type=int, default=3)
    p.add_argument("--eval-break", action="store_true",
                   help="evaluate as loops often do: enumerate a longer eval loader and break after --eval-batches "
                        "(its last fetch never evaluated), then a barrier")
    p.add_argument("--ckpt-slow", type=float, default=0.0,
                   help="seconds each checkpoint's file takes to write (a file object whose writes sleep)")
    p.add_argument("--ckpt-every", type=int, default=6, help="checkpoint after every Nth iteration (0: never)")
    p.add_argument("--save", help="at the end, save the optimizers' state here (for --resume)")
    p.add_argument("--resume", help="load the optimizers' state saved by --save")
    p.add_argument("--data-sleep", type=float, default=0.01, help="seconds each training batch takes to load")
    p.add_argument("--auto", action="store_true", help="no tpsprof call (tpsprof launch --auto instruments)")
    p.add_argument("--truth", required=True)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(LM(args.vocab, args.dim, args.seq))
    inner = model.module
    opt_body = torch.optim.SGD(list(inner.body.parameters()) + list(inner.head.parameters()), lr=0.01, momentum=0.9)
    # the frozen table first: it has no optimizer state (as in fine-tuning)
    opt_emb = torch.optim.AdamW([inner.pos] + list(inner.emb.parameters()), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt_body, step_size=3, gamma=0.9)
    if args.resume:
        state = torch.load(os.path.join(args.resume, "opt.%d.pt" % rank))
        opt_body.load_state_dict(state["body"])
        opt_emb.load_state_dict(state["emb"])
    g = torch.Generator().manual_seed(1234 + rank)

    class Slow(torch.utils.data.Dataset):
        def __init__(self, n, sleep):
            self.items = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g) for _ in range(n)]
            self.sleep = sleep

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            if self.sleep:
                time.sleep(self.sleep)
            s = self.items[i]
            return s[:, :-1].contiguous(), s[:, 1:].contiguous()  # (inputs, targets)

    loader = torch.utils.data.DataLoader(Slow(args.iters, args.data_sleep), batch_size=None)
    eval_loader = torch.utils.data.DataLoader(Slow(args.eval_batches * (3 if args.eval_break else 1), 0.01),
                                              batch_size=None)
    prof = None
    if not args.auto:
        import tpsprof.torch
        prof = tpsprof.torch.instrument(model, [opt_body, opt_emb], loader)

    out = open(os.path.join(args.truth, "truth.%d.jsonl" % rank), "w")
    ckpt_dir = os.path.join(args.truth, "ckpt.%d" % rank)
    os.makedirs(ckpt_dir, exist_ok=True)
    loss_fn = nn.CrossEntropyLoss()
    it = iter(loader)
    i = 0
    while True:
        t0 = time.time_ns()
        try:
            ids, labels = next(it)
        except StopIteration:
            break
        opt_body.zero_grad()
        opt_emb.zero_grad()
        loss = loss_fn(model(ids).reshape(-1, args.vocab), labels.reshape(-1))
        loss.backward()
        i += 1
        if args.skip_every and i % args.skip_every == 0:
            inner.body[0].weight.grad[0, 0] = float("inf")
        finite = all(torch.isfinite(q.grad).all() for q in model.parameters() if q.grad is not None)
        row = {"iter": i - 1, "rank": rank, "start_ns": t0, "tokens": labels.numel(), "loss": loss.item(),
               "skipped": not finite}
        if finite:
            opt_body.step()
            opt_emb.step()
            row["end_ns"] = time.time_ns()  # an iteration ends at its last optimizer step
            sched.step()
        out.write(json.dumps(row) + "\n")
        if args.eval_every and i % args.eval_every == 0:
            e0 = time.time_ns()
            model.eval()
            with torch.no_grad():
                for k, (eids, elabels) in enumerate(eval_loader):
                    if args.eval_break and k == args.eval_batches:
                        break  # this batch was fetched, never evaluated
                    loss_fn(model(eids).reshape(-1, args.vocab), elabels.reshape(-1))
            model.train()
            if args.eval_break:
                dist.barrier()
            out.write(json.dumps({"event": "eval", "rank": rank, "start_ns": e0, "end_ns": time.time_ns()}) + "\n")
        if args.ckpt_every and i % args.ckpt_every == 0:
            c0 = time.time_ns()
            state = {"model": model.state_dict(), "body": opt_body.state_dict(), "emb": opt_emb.state_dict()}
            if args.ckpt_slow:
                with SlowFile(os.path.join(ckpt_dir, "step%d.pt" % i), args.ckpt_slow) as f:
                    torch.save(state, f)
            else:
                torch.save(state, os.path.join(ckpt_dir, "step%d.pt" % i))
            out.write(json.dumps({"event": "checkpoint_save", "rank": rank, "start_ns": c0,
                                  "end_ns": time.time_ns()}) + "\n")
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        torch.save({"body": opt_body.state_dict(), "emb": opt_emb.state_dict()},
                   os.path.join(args.save, "opt.%d.pt" % rank))
    out.close()
    if prof is not None:
        prof.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
