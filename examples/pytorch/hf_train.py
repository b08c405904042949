"""A Hugging Face Trainer run measured by tpsprof's Trainer callback.

A tiny GPT-2 built from a config (randomly initialised, nothing
downloaded) trains on random token rows, some of them padded (labels -100,
attention mask 0), with gradient accumulation, evaluation every
--eval-steps and a checkpoint every --save-steps into --out; --resume
CHECKPOINT resumes from one of them.

The job logs its own truth (--truth DIR, one JSON line per optimizer step):
the Trainer's step number, the tokens it trained on (labels other than -100
after the shift, counted here from the micro-batches it trained), and its own
clock at each optimizer step's end; evaluations and checkpoints with their
own clock around them.

    tpsprof launch --job hf -- python3 examples/pytorch/hf_train.py --truth /tmp/truth
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
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments,
                          default_data_collator)

from tpsprof.hf import TpsprofCallback


def rows(n, seq, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(0, vocab, (seq,), generator=g)
        mask = torch.ones(seq, dtype=torch.long)
        labels = ids.clone()
        pad = int(torch.randint(0, seq // 2, (1,), generator=g)) if i % 3 == 0 else 0
        if pad:
            mask[-pad:] = 0
            labels[-pad:] = -100
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


class Truth(TrainerCallback):
    """The job's own log: what it trained on and its own clocks."""

    def __init__(self, path):
        self.f = open(path, "a")
        self.tokens = 0

    def write(self, **kw):
        self.f.write(json.dumps(kw) + "\n")
        self.f.flush()

    def on_step_end(self, args, state, control, **kw):
        self.write(kind="step", step=state.global_step - 1, tokens=self.tokens, end=time.time_ns())
        self.tokens = 0


class Measured(Trainer):
    """The Trainer, counting each micro-batch's trained tokens itself."""

    truth = None

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.truth.tokens += int((inputs["labels"][..., 1:] != -100).sum())
        return super().training_step(model, inputs, num_items_in_batch)

    def evaluate(self, *a, **kw):
        t0 = time.time_ns()
        try:
            return super().evaluate(*a, **kw)
        finally:
            self.truth.write(kind="eval", step=self.state.global_step, start=t0, end=time.time_ns())

    def _save_checkpoint(self, *a, **kw):
        t0 = time.time_ns()
        try:
            return super()._save_checkpoint(*a, **kw)
        finally:
            self.truth.write(kind="save", step=self.state.global_step, start=t0, end=time.time_ns())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the Trainer's output folder (checkpoints)")
    p.add_argument("--truth", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--eval-steps", type=int, default=5)
    p.add_argument("--save-steps", type=int, default=6)
    p.add_argument("--resume", metavar="CHECKPOINT", help="resume from this checkpoint folder")
    p.add_argument("--no-callback", action="store_true",
                   help="leave tpsprof's callback out (tpsprof launch --auto adds it to every Trainer)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="the Trainer logs every step to TensorBoard in DIR (and closes its writer at the end)")
    a = p.parse_args()
    if a.tensorboard:
        os.environ["TENSORBOARD_LOGGING_DIR"] = a.tensorboard  # (transformers 5 reads it; logging_dir is deprecated)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    seq, vocab = 32, 128
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=seq,
                                                bos_token_id=0, eos_token_id=0))
    args = TrainingArguments(output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=a.eval_steps,
                             per_device_eval_batch_size=8, save_strategy="steps", save_steps=a.save_steps,
                             logging_steps=1 if a.tensorboard else 1000, report_to="tensorboard" if a.tensorboard else "none",
                             use_cpu=True, dataloader_num_workers=0,
                             disable_tqdm=True, learning_rate=1e-3, seed=0)
    os.makedirs(a.truth, exist_ok=True)
    truth = Truth(os.path.join(a.truth, "truth.%d.jsonl" % os.getpid()))
    trainer = Measured(model=model, args=args, train_dataset=rows(8 * a.steps, seq, vocab, 1),
                       eval_dataset=rows(16, seq, vocab, 2), data_collator=default_data_collator,
                       callbacks=[truth] if a.no_callback else [truth, TpsprofCallback()])
    trainer.truth = truth
    trainer.train(resume_from_checkpoint=a.resume)
    print("tpsprof hf: %d steps" % trainer.state.global_step)


if __name__ == "__main__":
    main()
