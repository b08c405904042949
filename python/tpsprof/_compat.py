"""Which PyTorch gives which hook: one table of capabilities, probed once.

Every place that depends on a PyTorch feature asks here (``has``) instead
of probing on its own, and says why a measure is missing with ``why_not``
(``"torch 1.13.1 has no torch.utils.flop_counter.FlopCounterMode (2.1 and
later)"``): the report prints that instead of a silent zero.
"""

import torch


def _version():
    try:
        return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return (0, 0)


def _flop_counter():
    from torch.utils.flop_counter import FlopCounterMode  # noqa: F401
    return True


def _dispatcher_collectives():
    return (_version() >= (2, 0) and hasattr(torch, "library") and hasattr(torch._C, "_dispatch_keyset_full_after")
            and hasattr(torch._ops.OpOverload, "redispatch"))


def _optimizer_step_hooks():
    return hasattr(torch.optim.Optimizer, "register_step_pre_hook") and hasattr(torch.optim.Optimizer, "register_step_post_hook")


def _compile():
    return callable(getattr(torch, "compile", None))


def _cuda_memory_stats():
    return hasattr(torch._C, "_cuda_memoryStats") or hasattr(torch.cuda, "memory_stats")


def _pipelining():
    import importlib.util
    return importlib.util.find_spec("torch.distributed.pipelining") is not None


# name: (the first PyTorch with it, what it is, what the package does with
# it, its probe)
CAPABILITIES = {
    "dispatcher_collectives": ("2.0", "c10d dispatcher operators for collectives",
                               "communication of any API (DDP's reducer, FSDP2, functional collectives) at one place; "
                               "before, the torch.distributed functions are wrapped", _dispatcher_collectives),
    "flop_counter": ("2.1", "torch.utils.flop_counter.FlopCounterMode",
                     "FLOPs counted by PyTorch on sampled steps (counted_flops)", _flop_counter),
    "optimizer_step_hooks": ("2.0", "Optimizer.register_step_pre_hook and register_step_post_hook",
                             "the optimizer's time; before, the step method is wrapped", _optimizer_step_hooks),
    "compile": ("2.0", "torch.compile", "compiled models watched through their wrapper", _compile),
    "cuda_memory_stats": ("1.0", "the CUDA allocator's statistics", "device memory per step (memory)", _cuda_memory_stats),
    "pipelining": ("2.4", "torch.distributed.pipelining", "the pipeline stage a schedule runs", _pipelining),
}

_probed = {}


def has(name):
    """Whether this PyTorch has capability ``name`` (a key of CAPABILITIES);
    probed once, never raises."""
    got = _probed.get(name)
    if got is None:
        try:
            got = bool(CAPABILITIES[name][3]())
        except Exception:
            got = False
        _probed[name] = got
    return got


def why_not(name):
    """Why capability ``name`` is missing, in the report's words."""
    since, what = CAPABILITIES[name][0], CAPABILITIES[name][1]
    return "torch %s has no %s (%s and later)" % (torch.__version__, what, since)


def table():
    """Each capability and whether this PyTorch has it."""
    return {name: has(name) for name in CAPABILITIES}
