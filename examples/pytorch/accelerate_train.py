"""A Hugging Face Accelerate job measured by tpsprof.torch.instrument() on
the objects ``accelerator.prepare`` returned (or by nothing at all, under
``tpsprof launch --auto``).

A tiny causal LM trains on random token rows, a third of them padded
(attention mask 0, labels -100), with gradient accumulation (--accum
micro-batches an optimizer step, Accelerate's own ``accumulate``): the
prepared optimizer's ``step()`` runs every micro-batch and steps the inner
optimizer only when gradients sync. Runs on CPU, one process or several
(torchrun, gloo).

The job logs its own truth (--truth DIR, a JSON line per optimizer step
and rank): the step, the tokens it trained on (the attention masks' sums
of the step's micro-batches, as it consumed them) and its own clock at the
optimizer step's end.

    tpsprof launch --job acc -- torchrun --nproc_per_node 2 examples/pytorch/accelerate_train.py --truth /tmp/truth
"""

import argparse
import json
import os
import sys
import time

try:
    import tpsprof  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch
from accelerate import Accelerator

VOCAB, SEQ = 128, 32


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 64)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        self.head = torch.nn.Linear(64, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = self.emb(input_ids)
        for _ in range(4):
            h = h + self.mlp(h)
        logits = self.head(h)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)


def rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        mask = torch.ones(SEQ, dtype=torch.long)
        labels = ids.clone()
        if i % 3 == 0:
            pad = 1 + int(torch.randint(0, SEQ // 2, (1,), generator=g))
            mask[-pad:] = 0
            labels[-pad:] = -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True)
    ap.add_argument("--steps", type=int, default=15, help="optimizer steps")
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--mode", choices=["instrument", "auto"], default="instrument")
    args = ap.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.distributed.is_initialized():
        # gloo, made here: Accelerate picks MPI where torch has it (Debian's
        # does), which numbers every process rank 0 of 1 under torchrun
        torch.distributed.init_process_group("gloo")
    acc = Accelerator(gradient_accumulation_steps=args.accum, cpu=True)
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    world = acc.num_processes
    data = rows(args.steps * args.accum * args.batch * world, seed=1)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False)
    model, opt, loader = acc.prepare(model, opt, loader)
    prof = None
    if args.mode == "instrument":
        import tpsprof.torch as tt
        prof = tt.instrument(model, opt, loader, job=os.environ.get("TPSPROF_JOB"))
    rank = acc.process_index
    os.makedirs(args.truth, exist_ok=True)
    truth = open(os.path.join(args.truth, "truth.%d.jsonl" % rank), "a")
    step, tokens = 0, 0
    for batch in loader:
        tokens += int(batch["attention_mask"].sum())
        with acc.accumulate(model):
            loss = model(**batch)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            truth.write(json.dumps({"step": step, "rank": rank, "tokens": tokens, "end": time.time_ns()}) + "\n")
            truth.flush()
            step, tokens = step + 1, 0
            time.sleep(0.02)  # the job's own host work between steps (logging), a part of its period
    if prof is not None:
        prof.close()
    acc.end_training()


if __name__ == "__main__":
    main()
