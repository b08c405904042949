"""A Lightning DDP fit on CPU (gloo, 2 processes under torchrun), measured
by tpsprof's Lightning callback, with one rank made slow: --slow-rank R
sleeps --slow-ms in each of its training_step calls (a slower input
pipeline or GPU, as the other ranks see it: they wait in DDP's
all-reduce). Lightning runs forward and backward inside
optimizer.step(closure) (automatic optimisation).

The job logs its own truth (--truth DIR, one JSON line per optimizer step
and rank): the step, the tokens it trained on (the attention mask's sum of
its micro-batches), its own clock at the step's end and the time its
training_step slept.

    tpsprof launch --job lit-ddp -- torchrun --nproc_per_node 2 examples/pytorch/lightning_ddp.py --truth /tmp/truth --slow-rank 1
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

try:
    import lightning as L
except ImportError:
    import pytorch_lightning as L

from tpsprof.lightning import TpsprofCallback

VOCAB, SEQ = 128, 32


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


class TinyLM(L.LightningModule):
    def __init__(self, slow_s):
        super().__init__()
        self.slow_s = slow_s
        self.emb = torch.nn.Embedding(VOCAB, 64)
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 64))
        self.head = torch.nn.Linear(64, VOCAB)

    def training_step(self, batch, batch_idx):
        if self.slow_s:
            time.sleep(self.slow_s)
        h = self.emb(batch["input_ids"])
        for _ in range(3):
            h = h + self.body(h)
        logits = self.head(h)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1), ignore_index=-100)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Truth(L.Callback):
    def __init__(self, path, rank):
        self.f = open(path, "a")
        self.rank = rank
        self.tokens = 0
        self.at = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.at = trainer.global_step
        self.tokens += int(batch["attention_mask"].sum())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.at:
            self.f.write(json.dumps({"step": trainer.global_step - 1, "rank": self.rank, "tokens": self.tokens, "end": time.time_ns()}) + "\n")
            self.f.flush()
            self.tokens = 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--truth", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=100)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.makedirs(a.truth, exist_ok=True)
    truth = Truth(os.path.join(a.truth, "truth.%d.jsonl" % rank), rank)
    data = rows(4 * a.steps * a.accum * world, 1)
    train = torch.utils.data.DataLoader(data, batch_size=4)
    trainer = L.Trainer(max_steps=a.steps, accumulate_grad_batches=a.accum, accelerator="cpu", devices=world,
                        num_nodes=1, strategy="ddp" if world > 1 else "auto", enable_progress_bar=False,
                        logger=False, enable_model_summary=False, enable_checkpointing=False,
                        num_sanity_val_steps=0, callbacks=[truth, TpsprofCallback()])
    trainer.fit(TinyLM(a.slow_ms / 1e3 if rank == a.slow_rank else 0), train)


if __name__ == "__main__":
    main()
