"""Reads a tracker's run back with the tracker's own code and prints the
tpsprof/ series as JSON: {"rows": [[step, {name: value}], ...]}.

    read_trackers.py wandb|tensorboard|mlflow DIR

"extra" says what else the run holds: W&B's summary (of the newest run in
DIR), TensorBoard's image and text tags and the steps of the job's own
scalars, MLflow's tpsprof/ artifacts.
"""

import glob
import json
import os
import struct
import sys


def wandb_rows(d):
    # The run file: LevelDB's log format (32 KiB blocks of records, each
    # with a 7-byte header) after W&B's 7-byte file header; each record is
    # one of W&B's own protobuf Records, decoded with wandb's definitions.
    from wandb.proto import wandb_internal_pb2 as pb
    paths = sorted(glob.glob(os.path.join(d, "wandb", "offline-run-*", "run-*.wandb")))
    rows = []
    for path in paths:
        summary = {}
        rows += wandb_file(path, pb, summary)
    return rows, {"summary": summary}


def wandb_file(path, pb, summary):
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:8]
    pos, block, rows, buf = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):  # full or last piece
            r = pb.Record()
            r.ParseFromString(buf)
            if r.WhichOneof("record_type") == "history":
                item = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
                fig = {k: v for k, v in item.items() if k.startswith("tpsprof/") and k != "tpsprof/step"}
                if "tpsprof/step" in item:
                    rows.append([item["tpsprof/step"], fig, item.get("_step")])
            elif r.WhichOneof("record_type") == "summary":
                for i in r.summary.update:
                    summary[i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
    return rows


def tensorboard_rows(d):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    rows, extra = {}, {"images": 0, "texts": 0, "step_points": 0, "job_steps": {}}
    for run in sorted({os.path.dirname(p) for p in glob.glob(os.path.join(d, "**", "events.out.tfevents.*"), recursive=True)}):
        acc = EventAccumulator(run, size_guidance={"scalars": 0, "images": 0, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        extra["images"] += sum(1 for t in tags["images"] if t.startswith("tpsprof/"))
        extra["texts"] += sum(1 for t in tags["tensors"] if t.startswith("tpsprof/") and "text" in t)
        for tag in tags["scalars"]:
            if not tag.startswith("tpsprof/"):  # the job's own series: the steps it logged them at
                extra["job_steps"].setdefault(tag, []).extend(ev.step for ev in acc.Scalars(tag))
                continue
            for ev in acc.Scalars(tag):
                rows.setdefault(ev.step, {})[tag] = ev.value
                if tag == "tpsprof/step_time_s":
                    extra["step_points"] += 1  # once a step and writer: two if a row went twice
    return [[s, f] for s, f in sorted(rows.items())], extra


def mlflow_rows(d):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow
    from mlflow.tracking import MlflowClient
    mlflow.set_tracking_uri("file://" + os.path.abspath(d))
    c = MlflowClient()
    rows, extra = {}, {"artifacts": 0}
    for exp in c.search_experiments():
        for run in c.search_runs([exp.experiment_id]):
            extra["artifacts"] += len(c.list_artifacts(run.info.run_id, "tpsprof"))
            for key in run.data.metrics:
                if not key.startswith("tpsprof/"):
                    continue
                for m in c.get_metric_history(run.info.run_id, key):
                    rows.setdefault(m.step, {})[key] = m.value
    return [[s, f] for s, f in sorted(rows.items())], extra


if __name__ == "__main__":
    kind, d = sys.argv[1], sys.argv[2]
    rows, extra = {"wandb": wandb_rows, "tensorboard": tensorboard_rows, "mlflow": mlflow_rows}[kind](d)
    print(json.dumps({"rows": rows, "extra": extra}))
