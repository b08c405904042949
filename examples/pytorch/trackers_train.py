"""A training loop that logs to its own tracker, as ML teams' jobs do: a
W&B run (offline), a TensorBoard SummaryWriter or an MLflow run on a local
file store, created on rank 0 the usual way. tpsprof is told nothing about
it: its figures land in the same run under ``tpsprof/`` (docs/trackers.md).

    tpsprof launch --job tb -- torchrun --nproc_per_node 2 examples/pytorch/trackers_train.py --tracker tensorboard --out /tmp/tb

--tracker wandb|tensorboard|mlflow|none; --out: where the tracker writes
(the W&B offline run, the event files, the MLflow store).
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
import tpsprof.torch  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402


class Tracker:
    """Rank 0's run in the named tracker; logs the loss each step."""

    def __init__(self, kind, out):
        self.kind = kind
        self.run = None
        if kind == "wandb":
            import wandb
            self.run = wandb.init(mode="offline", dir=out, project="tpsprof-test")
        elif kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter
            self.run = SummaryWriter(log_dir=out)
        elif kind == "mlflow":
            # a local file store (MLflow keeps it in maintenance: allowed by name)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            import mlflow
            mlflow.set_tracking_uri("file://" + os.path.abspath(out))
            mlflow.set_experiment("tpsprof-test")
            self.run = mlflow.start_run()

        if self.kind in ("wandb", "mlflow"):  # for tpsprof report --wandb/--mlflow RUN_ID afterwards
            rid = self.run.id if kind == "wandb" else self.run.info.run_id
            with open(os.path.join(out, "run_id"), "w") as f:
                f.write(rid)

    def log(self, step, loss):
        if self.kind == "wandb":
            import wandb
            wandb.log({"loss": loss})  # the job's own step counter: W&B's
        elif self.kind == "tensorboard":
            self.run.add_scalar("loss", loss, step)
        elif self.kind == "mlflow":
            import mlflow
            mlflow.log_metric("loss", loss, step=step)

    def finish(self):
        if self.kind == "wandb":
            import wandb
            wandb.finish()
        elif self.kind == "tensorboard":
            self.run.close()
        elif self.kind == "mlflow":
            import mlflow
            mlflow.end_run()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tracker", choices=("wandb", "tensorboard", "mlflow", "none"), default="none")
    p.add_argument("--out", default="/tmp/tpsprof-tracker")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--sleep", type=float, default=0.02, help="host time each step (s)")
    p.add_argument("--log-every", type=int, default=1, help="the job logs its loss every N steps")
    p.add_argument("--finish-first", action="store_true",
                   help="finish the tracker before tpsprof is closed (at exit), as jobs do")
    p.add_argument("--auto", action="store_true", help="no tpsprof call (under tpsprof launch --auto)")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    vocab, seq, batch = 256, 32, 4
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(vocab, 64), nn.Linear(64, vocab)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1 + rank)  # each replica its own batches
    tracker = Tracker(a.tracker, a.out) if rank == 0 else None
    prof = None if a.auto else tpsprof.torch.instrument(model, opt)
    for step in range(a.steps):
        ids = torch.randint(0, vocab, (batch, seq))
        time.sleep(a.sleep * (1 + (step % 3)))  # steps of different lengths
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if tracker is not None and (step + 1) % a.log_every == 0:
            tracker.log(step, loss.item())
    if a.finish_first:
        # as jobs do: the tracker ends first, tpsprof at exit (its last
        # rows go into the run as it ends)
        if tracker is not None:
            tracker.finish()
        if prof is not None:
            prof.close()
    else:
        if prof is not None:
            prof.close()
        if tracker is not None:
            tracker.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
