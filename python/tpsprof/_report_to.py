"""Writes a finished run's report into a tracker's run: what ``tpsprof
report --tensorboard DIR | --mlflow RUN | --wandb RUN`` runs (docs/trackers.md).

    python3 -m tpsprof._report_to --tensorboard DIR PAYLOAD.json

The payload (written by the tpsprof binary): {"job", "step" (the run's last
step), "figures" {name: value}, "markdown" (the report as Markdown),
"plots" [PNG paths]}. Figures go in at the run's last step (TensorBoard,
MLflow) or into the run's summary (W&B); the Markdown as text, the plots as
images. Prints one JSON line: what was written where.
"""

import argparse
import json
import os
import sys


def to_tensorboard(p, folder):
    from torch.utils.tensorboard import SummaryWriter
    from tensorboard.compat.proto.summary_pb2 import Summary
    from ._client import writable_folder
    w = SummaryWriter(log_dir=writable_folder(folder))
    try:
        step = p["step"]
        for k, v in sorted(p["figures"].items()):
            w.add_scalar(k, v, global_step=step)
        w.add_text("tpsprof/report", p["markdown"], global_step=step)
        for path in p["plots"]:
            with open(path, "rb") as f:
                png = f.read()
            w1, h1 = _png_size(png)
            tag = "tpsprof/report/" + os.path.splitext(os.path.basename(path))[0]
            img = Summary.Image(height=h1, width=w1, colorspace=4, encoded_image_string=png)
            w._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=img)]), step)
    finally:
        w.close()
    return {"tracker": "tensorboard", "where": folder}


def to_mlflow(p, run_id):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    import time
    c = MlflowClient()
    c.get_run(run_id)  # an existing run: a clear error otherwise
    ts = int(time.time() * 1000)
    metrics = [Metric(k, float(v), ts, p["step"]) for k, v in sorted(p["figures"].items())]
    for i in range(0, len(metrics), 1000):
        c.log_batch(run_id, metrics=metrics[i:i + 1000])
    c.log_text(run_id, p["markdown"], "tpsprof/report.md")
    for path in p["plots"]:
        c.log_artifact(run_id, path, "tpsprof")
    return {"tracker": "mlflow", "where": run_id}


def to_wandb(p, run_id, project):
    import wandb
    kw = {"id": run_id, "resume": "allow"}
    if project:
        kw["project"] = project
    run = wandb.init(**kw)
    try:
        run.summary.update(p["figures"])
        row = {"tpsprof/report/text": wandb.Html("<pre>%s</pre>" % _escape(p["markdown"]))}
        for path in p["plots"]:
            row["tpsprof/report/" + os.path.splitext(os.path.basename(path))[0]] = wandb.Image(path)
        run.log(row)
    finally:
        run.finish()
    return {"tracker": "wandb", "where": run_id}


def _escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _png_size(png):
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m tpsprof._report_to", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--tensorboard", metavar="DIR")
    g.add_argument("--mlflow", metavar="RUN_ID")
    g.add_argument("--wandb", metavar="RUN_ID")
    ap.add_argument("--wandb-project")
    ap.add_argument("payload")
    a = ap.parse_args(argv)
    with open(a.payload) as f:
        p = json.load(f)
    if a.tensorboard:
        got = to_tensorboard(p, a.tensorboard)
    elif a.mlflow:
        got = to_mlflow(p, a.mlflow)
    else:
        got = to_wandb(p, a.wandb, a.wandb_project)
    got.update(figures=len(p["figures"]), plots=len(p["plots"]))
    print(json.dumps(got))


if __name__ == "__main__":
    try:
        main()
    except ImportError as e:
        print("tpsprof report: the tracker's package is not importable by %s: %s" % (sys.executable, e), file=sys.stderr)
        sys.exit(3)
    except ValueError as e:  # a folder refused (writable_folder)
        print("tpsprof report: %s" % (e,), file=sys.stderr)
        sys.exit(4)
