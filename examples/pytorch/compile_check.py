"""Does instrumenting a compiled model change what torch.compile does?

    python compile_check.py --wrap ddp --instrument after

Trains a small model compiled with torch.compile (inductor, CPU) for a few
steps in one process (a gloo group of one for DDP and FSDP2) and prints, as
one JSON line, dynamo's own counters: graph breaks (with their reasons),
frames compiled, unique graphs, recompilations, and the warnings raised. Run
once with --instrument none and once with tpsprof, the counts must match.

  --wrap       plain | ddp | fsdp2          what is compiled
  --instrument none | before | after | auto
               before: instrument(model) then compile it;
               after: instrument(torch.compile(model));
               auto: as `tpsprof launch --auto` (the import hook)
  --compile-first  compile the model before its optimizer is made

"models_watched" says how many modules have their forward timed (zero-code
mode must find the compiled model without global module hooks).
"""

import argparse
import json
import os
import sys
import warnings

try:
    import tpsprof  # noqa: F401
except ImportError:  # a checkout, not under tpsprof launch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wrap", choices=["plain", "ddp", "fsdp2"], default="plain")
    p.add_argument("--instrument", choices=["none", "before", "after", "auto"], default="none")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--compile-first", action="store_true")
    args = p.parse_args()
    if args.instrument == "auto":
        os.environ["TPSPROF_AUTO"] = "1"
        from tpsprof import _auto
        _auto.arm()
    warnings.simplefilter("always")
    caught = []
    old_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        caught.append("%s: %s" % (category.__name__, str(message).splitlines()[0][:200]))
        old_show(message, category, filename, lineno, file, line)
    warnings.showwarning = show

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch._dynamo
    from torch._dynamo.utils import counters

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 500))
    if args.wrap != "plain":
        dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256))
    if args.wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif args.wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        fully_shard(model)
    compiled = None
    if args.compile_first and args.instrument in ("none", "auto"):
        compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [torch.randint(0, 256, (4, 33)) for _ in range(args.steps)]
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    prof = None
    if args.instrument == "before":
        import tpsprof.torch
        prof = tpsprof.torch.instrument(model, opt, loader)
        model = torch.compile(model)
    elif args.instrument == "after":
        import tpsprof.torch
        model = torch.compile(model)
        prof = tpsprof.torch.instrument(model, opt, loader)
    else:
        model = compiled if compiled is not None else torch.compile(model)
    loss_fn = nn.CrossEntropyLoss()
    for seq in loader:
        ids, labels = seq[:, :-1], seq[:, 1:]
        loss = loss_fn(model(ids).reshape(-1, 256), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
    if prof is None and args.instrument == "auto":
        import tpsprof.torch
        prof = tpsprof.torch.active()
    watched = 0 if prof is None else len(prof._models)
    if prof is not None:
        prof.close()  # records are sent by a thread of the package: counted once it drained
    breaks = dict(counters["graph_break"])
    stats = dict(counters["stats"])
    print(json.dumps({
        "wrap": args.wrap, "instrument": args.instrument,
        "graph_breaks": sum(breaks.values()), "break_reasons": sorted(breaks),
        "frames_ok": stats.get("calls_captured", 0), "unique_graphs": stats.get("unique_graphs", 0),
        "recompiles": sum(v for k, v in counters["recompiles"].items()) if "recompiles" in counters else 0,
        "frame_counts": dict(counters["frames"]),
        "warnings": sorted(set(caught)),
        "profiled": prof is not None and not prof.off,
        "steps_measured": 0 if prof is None else prof.steps,
        "profiler_errors": 0 if prof is None else prof.errors,
        "models_watched": watched,
    }), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
