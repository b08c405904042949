"""The job's parallel layout, read from what it built: the device mesh of its
DTensor parameters (FSDP2, tensor parallel, 2-D meshes, HSDP) and the stage a
torch.distributed.pipelining schedule runs. tpsprof.torch sends it with the
records so that tokens are counted once per data-parallel replica with
nothing declared (docs/capture.md, "Topology").
"""

import warnings
from typing import Any, Dict, Iterable, Optional, Tuple

__all__ = ["dim_kind", "job_topology", "mesh_topology"]

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
