"""Reads a tracker's run back with the tracker's own code and prints the
tpsprof/ series as JSON: {"rows": [[step, {name: value}], ...]}.

    read_trackers.py wandb|tensorboard|mlflow DIR
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
    (path,) = glob.glob(os.path.join(d, "wandb", "offline-run-*", "run-*.wandb"))
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
    return rows


def tensorboard_rows(d):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    rows = {}
    for run in sorted({os.path.dirname(p) for p in glob.glob(os.path.join(d, "**", "events.out.tfevents.*"), recursive=True)}):
        acc = EventAccumulator(run, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if not tag.startswith("tpsprof/"):
                continue
            for ev in acc.Scalars(tag):
                rows.setdefault(ev.step, {})[tag] = ev.value
    return [[s, f] for s, f in sorted(rows.items())]


def mlflow_rows(d):
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    import mlflow
    from mlflow.tracking import MlflowClient
    mlflow.set_tracking_uri("file://" + os.path.abspath(d))
    c = MlflowClient()
    rows = {}
    for exp in c.search_experiments():
        for run in c.search_runs([exp.experiment_id]):
            for key in run.data.metrics:
                if not key.startswith("tpsprof/"):
                    continue
                for m in c.get_metric_history(run.info.run_id, key):
                    rows.setdefault(m.step, {})[key] = m.value
    return [[s, f] for s, f in sorted(rows.items())]


if __name__ == "__main__":
    kind, d = sys.argv[1], sys.argv[2]
    print(json.dumps({"rows": {"wandb": wandb_rows, "tensorboard": tensorboard_rows, "mlflow": mlflow_rows}[kind](d)}))
