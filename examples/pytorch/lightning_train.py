"""A Lightning fit measured by tpsprof's Lightning callback.

A tiny next-token model (an embedding and a linear head, randomly
initialised) trains on random token rows, some of them padded (attention
mask 0, labels -100), with gradient accumulation of 2, validation every
--val-every batches and a checkpoint every --save-every optimizer steps
into --out; --resume CHECKPOINT resumes from one of them.

The job logs its own truth (--truth DIR, one JSON line per optimizer step):
the step number, the tokens it trained on (the attention mask's sum over
the micro-batches Lightning handed to training_step) and its own clock at
the step's end; validations and checkpoints with its own clock around them.
--tensorboard DIR logs the loss each step through Lightning's
TensorBoardLogger, which the fit closes at its end (tpsprof's rows ride on
its writer).

    tpsprof launch --job lit -- python3 examples/pytorch/lightning_train.py --out /tmp/ckpt --truth /tmp/truth
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
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger
except ImportError:
    import pytorch_lightning as L
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.loggers import TensorBoardLogger

from tpsprof.lightning import TpsprofCallback

VOCAB, SEQ = 128, 32


def rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=g)
        mask = torch.ones(SEQ, dtype=torch.long)
        labels = ids.clone()
        pad = int(torch.randint(1, SEQ // 2, (1,), generator=g)) if i % 3 == 0 else 0
        if pad:
            mask[-pad:] = 0
            labels[-pad:] = -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


class TinyLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 64)
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
        self.head = torch.nn.Linear(64, VOCAB)

    def loss(self, batch):
        h = self.body(self.emb(batch["input_ids"]))
        logits = self.head(h)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1), ignore_index=-100)

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        return self.loss(batch)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Truth(L.Callback):
    """The job's own log: what it trained on and its own clocks."""

    def __init__(self, path):
        self.f = open(path, "a")
        self.tokens = 0
        self.at = None
        self.val0 = None

    def write(self, **kw):
        self.f.write(json.dumps(kw) + "\n")
        self.f.flush()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.at = trainer.global_step
        self.tokens += int(batch["attention_mask"].sum())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.at:  # the optimizer stepped: the step is over
            self.write(kind="step", step=trainer.global_step - 1, tokens=self.tokens, end=time.time_ns())
            self.tokens = 0

    def on_validation_start(self, trainer, pl_module):
        self.val0 = time.time_ns()

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.write(kind="eval", step=trainer.global_step, start=self.val0, end=time.time_ns())


class Measured(L.Trainer):
    """The Trainer, timing its own checkpoints."""

    truth = None

    def save_checkpoint(self, *a, **kw):
        t0 = time.time_ns()
        try:
            return super().save_checkpoint(*a, **kw)
        finally:
            self.truth.write(kind="save", step=self.global_step, start=t0, end=time.time_ns())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="checkpoints go here")
    p.add_argument("--truth", required=True)
    p.add_argument("--steps", type=int, default=12, help="optimizer steps")
    p.add_argument("--val-every", type=int, default=10, help="validate every N batches (micro-batches)")
    p.add_argument("--save-every", type=int, default=6, help="checkpoint every N optimizer steps")
    p.add_argument("--resume", metavar="CHECKPOINT", help="resume from this checkpoint file")
    p.add_argument("--tensorboard", metavar="DIR", help="log through Lightning's TensorBoardLogger into DIR")
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    os.makedirs(a.truth, exist_ok=True)
    truth = Truth(os.path.join(a.truth, "truth.%d.jsonl" % os.getpid()))
    train = torch.utils.data.DataLoader(rows(8 * a.steps, 1), batch_size=4)
    val = torch.utils.data.DataLoader(rows(16, 2), batch_size=8)
    ckpt = ModelCheckpoint(dirpath=a.out, every_n_train_steps=a.save_every, save_top_k=-1,
                           filename="step-{step}", save_on_train_epoch_end=False)
    trainer = Measured(max_steps=a.steps, accumulate_grad_batches=2, val_check_interval=a.val_every,
                       accelerator="cpu", devices=1, enable_progress_bar=False, log_every_n_steps=1,
                       logger=TensorBoardLogger(a.tensorboard, name="", version="") if a.tensorboard else False,
                       enable_model_summary=False, num_sanity_val_steps=0,
                       callbacks=[truth, ckpt, TpsprofCallback()])
    trainer.truth = truth
    trainer.fit(TinyLM(), train, val, ckpt_path=a.resume)
    print("tpsprof lightning: %d steps" % trainer.global_step)


if __name__ == "__main__":
    main()
