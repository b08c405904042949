"""The job's parallel layout, read from what it built: the device mesh of its
DTensor parameters (FSDP2, tensor parallel, 2-D meshes, HSDP) and the stage a
torch.distributed.pipelining schedule runs. tpsprof.torch sends it with the
records so that tokens are counted once per data-parallel replica with
nothing declared (docs/capture.md, "Topology").
"""

import sys
import warnings
from typing import Any, Dict, Iterable, Optional, Tuple

__all__ = ["dim_kind", "job_topology", "mesh_topology", "JobLayout"]

Layout = Tuple[Dict[str, int], Dict[str, int]]  # sizes {"dp", "tp", "pp", "cp"}, this rank's coordinates


_DIMS = (
    ("dp", ("dp", "data", "replicate", "shard", "fsdp", "hsdp", "ddp", "dp_replicate", "dp_shard", "dp_cp", "batch")),
    ("tp", ("tp", "tensor", "model", "mp")),
    ("pp", ("pp", "pipe", "pipeline", "stage")),
    ("cp", ("cp", "context")),
    ("ep", ("ep", "expert")),
)


def dim_kind(name: Optional[str]) -> Optional[str]:
    n = (name or "").lower()
    for kind, names in _DIMS:
        if n in names:
            return kind
    for kind, names in _DIMS:
        if any(part in names for part in n.replace("-", "_").split("_")):
            return kind
    return None


def job_topology(params: Iterable[Any], world_size: int, stage: Any = None) -> Optional[Layout]:
    """The job's layout from what it built: the device mesh of its DTensor
    parameters (mesh_topology) and the pipeline stage its schedule runs
    (the stage's group size is the pipeline's). None when they do not
    account for every rank."""
    pp = pp_rank = None
    if stage is not None:
        try:
            pp, pp_rank = int(stage.group_size), int(stage.group_rank)
        except Exception:
            pp = None
    whole = mesh_topology(params, world_size)
    if pp is None or pp <= 1 or (whole is not None and whole[0]["pp"] == pp):
        return whole  # the mesh spans every rank (with its pipeline dimension)
    if world_size % pp:
        return None
    got = mesh_topology(params, world_size // pp)
    if got is None:
        if world_size != pp:
            return None  # data-parallel pipelines without a mesh: which replica is unknown
        got = ({"dp": 1, "tp": 1, "pp": 1, "cp": 1}, {"dp_rank": 0, "tp_rank": 0, "pp_rank": 0, "cp_rank": 0})
    sizes, coords = got
    if sizes["pp"] != 1:
        return None
    sizes["pp"], coords["pp_rank"] = pp, pp_rank
    return sizes, coords


def mesh_topology(params: Iterable[Any], world_size: int) -> Optional[Layout]:
    """The layout the job's device mesh gives: ({"dp":..,"tp":..,"pp":..,
    "cp":..}, {"dp_rank":..,...}) for this rank, or None when no parameter
    is a DTensor, the mesh does not span the whole job, or a dimension's
    name says nothing of its kind. Dimensions are told apart by name
    (torchtitan's dp_replicate, dp_shard, cp, tp, pp; "dp", "tp", ...);
    several data-parallel dimensions (HSDP) make one, and an expert
    dimension counts as data-parallel for tokens (its ranks see
    different batches)."""
    best = None
    seen = set()
    for p in params:
        mesh = getattr(p, "device_mesh", None)
        if mesh is None or id(mesh) in seen:
            continue
        seen.add(id(mesh))
        root = mesh
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                get = getattr(mesh, "_get_root_mesh", None)
                if get is not None:
                    root = get() or mesh
                else:  # older PyTorch 2
                    from torch.distributed.device_mesh import _mesh_resources
                    root = _mesh_resources.get_root_mesh(mesh) or mesh
        except Exception:
            root = mesh
        if best is None or root.size() > best.size():
            best = root
    if best is None or best.size() != world_size:
        return None
    names = best.mesh_dim_names
    coord = best.get_coordinate()
    shape = tuple(best.mesh.shape)
    if not names and len(shape) == 1:
        names = ("dp",)  # fully_shard's own mesh when given none
    if not names or coord is None:
        return None
    sizes = {"dp": 1, "tp": 1, "pp": 1, "cp": 1}
    coords = {"dp_rank": 0, "tp_rank": 0, "pp_rank": 0, "cp_rank": 0}
    for name, n, c in zip(names, shape, coord):
        kind = dim_kind(name)
        if kind is None:
            return None
        if kind == "ep":
            kind = "dp"
        key = kind + "_rank"
        coords[key] = coords[key] * n + c  # row-major over the dimensions of one kind
        sizes[kind] *= n
    return sizes, coords


class JobLayout:
    """The job's layout as the in-process profiler sends it (a component
    of TorchProfiler, ``prof.layout``): the pipeline stage and schedule a
    torch.distributed.pipelining schedule runs (first seen), and after the
    first step the layout read from the parameters' device mesh. It
    reaches the profiler through its seam (``client``, ``params()``,
    ``failed()``, ``later(fn)``)."""

    def __init__(self, prof):
        self.prof = prof
        self.stage = None  # the stage a pipelining schedule runs (first seen)
        self.schedule = None  # its (micro-batches, stages a rank)
        self.sizes = None  # what the job's device mesh says, once read
        self.done = False

    def note_stage(self, schedule: Any) -> None:
        """A pipelining schedule steps: the stage it runs (its first, for
        a schedule of several), as first seen, is the topology's pipeline
        coordinate."""
        if self.stage is not None:
            return
        st = getattr(schedule, "_stage", None)
        if st is None:
            st = (getattr(schedule, "_stages", None) or [None])[0]
        self.stage = st
        # its micro-batches and stages a rank (virtual stages): the
        # schedule's own bubble, which the report holds the measured
        # bubble to (sent with the topology, where it has pp > 1)
        try:
            m = int(getattr(schedule, "_n_microbatches", 0) or 0)
            v = len(getattr(schedule, "_stages", None) or [st])
            self.schedule = (m, v) if m > 0 else None
        except Exception:
            self.schedule = None

    def after_first_step(self) -> None:
        """Once, after the first step: the parallel layout from the device
        mesh of the parameters (DTensor: FSDP2, tensor parallel, 2-D, HSDP)
        and the pipeline stage, sent as each record's coordinates and, by
        every rank before its first record, as the job's topology, so that
        tokens are counted once per data-parallel replica with nothing
        declared. A declared topology (TPSPROF_TOPOLOGY) that contradicts
        the mesh is reported and the mesh wins: it is what the job built."""
        if self.done:
            return
        self.done = True
        prof = self.prof
        c = prof.client
        try:
            got = job_topology(prof.params(), c.world_size, self.stage)
        except Exception:
            prof.failed()
            return
        if got is None:
            return
        from ._client import topology_coords
        sizes, coords = got
        self.sizes = sizes
        declared = getattr(c, "declared_topology", None)
        if declared:
            try:
                d = topology_coords(declared, c.rank)
            except (ValueError, ZeroDivisionError):
                d = None
            if d is None or {k: d.get(k) for k in coords} != coords:
                sys.stderr.write("tpsprof: rank %d: the declared topology %r does not match the job's device mesh "
                                 "(%s, this rank at %s); the mesh's is used\n" % (
                                     c.rank, declared, ",".join("%s=%d" % kv for kv in sizes.items()),
                                     ",".join("%s=%d" % (k[:-5], v) for k, v in coords.items())))
        c.set_coords(coords)
        extra = {}
        if self.schedule is not None and sizes.get("pp", 1) > 1:
            extra["micro_batches"] = self.schedule[0]
            if self.schedule[1] > 1:
                extra["interleave"] = self.schedule[1]
        # every rank, before its first record: whichever rank's record
        # reaches the collector first, the layout is there before it
        prof.later(lambda: c.meta(topology=sizes, **extra))
