"""Communication captured where every collective passes, however it was issued.

On PyTorch 2 every collective of a process group goes through a dispatcher
operator: ``c10d::allreduce_``, ``c10d::_allgather_base_``, ``c10d::send``
... for the ``torch.distributed`` API (under any name it was imported as),
DDP's reducer (in C++), FSDP2 and pipelining; ``_c10d_functional::*`` for
functional collectives (DTensor, tensor parallel, async TP, and what
``torch.compile`` turns collectives into). A kernel of ours registered at
those operators' ``BackendSelect`` key notes the call and redispatches to
PyTorch's own kernel for the tensors' backend: the collective itself, its
arguments and its result are untouched, and no Python frame of ours is
traced by dynamo (the operators stay opaque to it), so compiled graphs do
not change.

Why ``BackendSelect``: it is in every call's key set and sits below the
autograd, Python (tensor subclasses, DTensor) and fake-tensor keys, so the
kernel sees the plain tensors of every real call, also the calls made where
autograd is already excluded (inside a tensor subclass's
``__torch_dispatch__``, as DTensor and ``AsyncCollectiveTensor`` wait and
redistribute; under an autograd kernel), which a kernel at the autograd keys
misses. Fake and meta tensors of a compilation never run a collective.

What is noted, for the active profiler (see tpsprof.torch):
- a collective's span, from the backend taking it (on CPU the issue
  plus the host's own CPU work in the issuing call, see
  ``_comm.Comm.started``; on a GPU the issue on the issuing stream) to its
  completion: the work's completion (polled on CPU, a CUDA event from
  the work's future on a GPU) for c10d operators; for functional ones
  the end of its ``wait_tensor`` (the completion as the issuing stream
  sees it), on CPU earlier when the works of the c10d calls it made
  complete first;
- time the host blocks in ``Work.wait()`` or ``wait_tensor``;
- point-to-point apart: the time blocked waiting for a receive or a send
  to complete is the pipeline wait (``pp_wait_ns``), waiting for another
  stage, not communication; a receive's span is not communication either.

PyTorch 1.13's Python API does not go through these operators; there the
``torch.distributed`` functions are wrapped instead (tpsprof.torch).
docs/capture.md gives the table per version.
"""

import sys
import threading
import time

import torch

from . import _compat

# The torch.distributed functions wrapped on PyTorch 1.13 (before collectives
# were dispatcher operators), whose calls are timed as communication. Object
# collectives (all_gather_object, ...) go through these.
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce_scatter",
    "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "reduce", "all_to_all",
    "all_to_all_single", "gather", "scatter", "barrier", "send", "recv", "isend", "irecv",
    "batch_isend_irecv",
)

# operators that are not communication of the training step: c10d's
# checks, and the functional collectives' wrapping of an output in an
# AsyncCollectiveTensor (a custom op in their namespace on PyTorch 2.14,
# called after each functional collective outside a trace)
_SKIP = frozenset({"check_for_nan", "monitored_barrier_", "_wrap_tensor_autograd"})
# point-to-point receives: waiting for one is waiting for another stage
_RECV = frozenset({"recv_", "recv_any_source_"})
# point-to-point sends: their transfer is communication, but the time
# blocked waiting for one to complete is waiting for the other stage to
# take it (pipeline wait), like a receive's
_SEND = frozenset({"send"})
_F_RECV = frozenset({"irecv"})

# The registration of our kernels, made once per process: torch.library
# handles unregister their kernels when collected, so they are held here for
# the process's life (with the operators hooked, for docs and tests). The
# calls themselves report to the active profiler (``active()``).
_lib = None
_lock = threading.Lock()
installed = False
ops = []


def skip_dynamo(fn):
    """Tells torch.compile never to compile fn's frames nor the frames they
    call (they run as written, outside any graph). Our kernels and hooks
    run inside compiled programs' eager parts (a collective issued after a
    graph break, a hook of a module called there); dynamo would otherwise
    try to compile them as frames of their own and break on our clocks.
    Uses dynamo's C-level per-code setting, so torch._dynamo (over a second
    to import) is not imported for jobs that never compile. Returns fn."""
    ef = _EVAL_FRAME
    if ef is None:
        return fn  # PyTorch 1.13: nothing compiles our frames
    try:
        code = getattr(fn, "__func__", fn).__code__
        skip = ef._FrameAction.SKIP
        ef.set_code_exec_strategy(code, ef._FrameExecStrategy(skip, skip))
    except Exception:
        pass  # a PyTorch without the setting: nothing compiles our frames there
    return fn


_EVAL_FRAME = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)


def compiling():
    """True while dynamo traces (constant inside a traced function, so a hook
    that returns on it adds nothing to the graph and no graph break)."""
    f = _is_compiling
    return f is not None and f()


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def available():
    """True on PyTorch 2 and later, where collectives are dispatcher ops."""
    return _compat.has("dispatcher_collectives")


def install(active):
    """Registers the kernels once per process; ``active()`` returns the
    profiler to report to (or None: the kernels then only redispatch).
    Returns whether the dispatcher path is in use."""
    global _lib, installed
    with _lock:
        if installed:
            return True
        if not available():
            return False
        try:
            names = sorted(n for n in torch._C._dispatch_get_all_op_names()
                           if n.startswith("c10d::") or n.startswith("_c10d_functional::"))
        except Exception:
            return False
        if not any(n.startswith("c10d::") for n in names):
            return False
        lib_c10d = torch.library.Library("c10d", "IMPL")
        lib_f = torch.library.Library("_c10d_functional", "IMPL")
        hooked = []
        for full in names:
            ns, name = full.split("::", 1)
            if name in _SKIP:
                continue
            packet = getattr(getattr(torch.ops, ns), name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                qual = name if overload == "default" else "%s.%s" % (name, overload)
                if ns == "c10d":
                    k = _c10d_kernel(op, name, active)
                elif name == "wait_tensor":
                    k = _wait_kernel(op, active)
                else:
                    k = _functional_kernel(op, name, active)
                lib = lib_c10d if ns == "c10d" else lib_f
                try:
                    if torch._C._dispatch_has_kernel_for_dispatch_key(full, "BackendSelect"):
                        continue  # PyTorch's own: never replaced
                    lib.impl(qual, k, "BackendSelect")
                except Exception:
                    continue
                hooked.append("%s::%s" % (ns, qual))
        _lib = (lib_c10d, lib_f)
        _patch_wait(active)
        ops[:] = hooked
        installed = True
        return True


# DDP's bucket all-reduces past our kernels (set_ddp_bypass): a fallthrough
# registered over our kernel at BackendSelect, in C++, so the dispatcher
# goes straight to the backend's kernel. A Python kernel costs each call
# its way into Python and back (the process group, the reduce op and the
# work boxed): 41-52 us a bucket in DDP's backward on PyTorch 2.14 on a
# 2-core machine, 13 buckets a step in the cost protocol's job, most of
# what the package cost its training thread there. Putting the
# fallthrough on and taking it off costs 22 + 7 us timed in a training
# step (3.4 + 0.4 in a tight loop, the registration path in the caches)
# through the registration handle's own API (torch.library's Python layer
# over it costs twice that). Our kernel stays registered beneath it
# (nothing of ours is freed while a call may run it).
_BYPASS_OPS = ("allreduce_",)
_bypass = None  # the registration while on


def set_ddp_bypass(on):
    """Puts DDP's all-reduces past our kernels (on) or back through them.
    Returns whether they are past them now. Called on the training thread
    at a reducer-timed DDP backward's start and end (tpsprof._comm): any
    all-reduce issued meanwhile, by DDP or by another thread, is not seen
    by our kernels."""
    global _bypass
    if not on:
        b, _bypass = _bypass, None
        if b is not None:
            b.reset()
        return False
    if _bypass is None:
        _bypass = _fallthrough_over("c10d", _BYPASS_OPS)
    return _bypass is not None


# Synchronous collectives past our kernels between sampled steps
# (set_sync_bypass; tpsprof._comm decides which): c10d operators every
# call of which, on the last sampled step, was waited on at once by the
# call that issued it (FSDP2's all-gathers and reduce-scatters on CPU, the
# torch.distributed API's default), timed then by their Work.wait() alone
# (_comm.Comm.work_waited): on CPU such a call hands the collective to
# gloo and waits for it at once, so the wait is its span, less the issuing
# call's host work, which is not communication. And functional collectives
# every call of which was waited on (tensor parallelism's), with the c10d
# operators they call, timed by their wait_tensor and the hidden part
# carried from the sampled steps (_comm.Comm.functional_waited).
# Registrations of their own, apart from DDP's, on for whole steps.
_sync_bypass = ()  # the registrations while on
_sync_names = ((), ())  # the operators past our kernels: (c10d, functional)


def set_sync_bypass(names, functional=()):
    """Puts the c10d operators ``names`` and the functional ones
    ``functional`` past our kernels (either not empty) or every one back
    through them (both empty). Returns whether any is past them now.
    Called on the training thread between steps (tpsprof._comm)."""
    global _sync_bypass, _sync_names
    want = (tuple(sorted(n for n in names if n not in _RECV and n not in _SEND)),
            tuple(sorted(n for n in functional if n not in _F_RECV)))
    if want == _sync_names:
        return bool(want[0] or want[1])
    for b in _sync_bypass:
        b.reset()
    _sync_bypass, _sync_names = (), ((), ())
    regs = [_fallthrough_over(ns, ops) for ns, ops in (("c10d", want[0]), ("_c10d_functional", want[1])) if ops]
    if not regs or None in regs:
        for b in regs:
            if b is not None:
                b.reset()
        return False
    _sync_bypass, _sync_names = tuple(regs), want
    return True


def sync_past(name):
    """Whether the c10d operator ``name`` is past our kernels for whole
    steps now (set_sync_bypass)."""
    return name in _sync_names[0]


_warned = False  # PyTorch's warning that a kernel (ours) is overridden: said once a process, silenced


def _fallthrough_over(ns, names):
    """Registers PyTorch's fallthrough over our kernels at BackendSelect
    for the operators ``names`` of namespace ``ns``, in C++: the
    dispatcher then goes straight to the backend's kernel. Returns the
    registration (its ``reset()`` takes it off, our kernels beneath it
    again), or None where it cannot be made."""
    global _warned
    if not installed or _fallthrough is None:
        return None
    try:
        m = torch._C._dispatch_library("IMPL", ns, "", "", 0)
        if _warned:
            _fall(m, names)  # (a warnings filter costs a few us: the bypass of DDP's comes on every backward)
        else:
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _fall(m, names)
            _warned = True
    except Exception:
        return None
    return m


def _fall(m, names):
    for name in names:
        try:
            m.impl(name, "BackendSelect", _fallthrough, False)
        except TypeError:  # (before PyTorch 2.2: no with_keyset argument)
            m.impl(name, "BackendSelect", _fallthrough)


_fallthrough = getattr(getattr(torch, "library", None), "fallthrough_kernel", None) \
    if hasattr(torch._C, "_dispatch_library") else None


# the dispatch keys after BackendSelect (a constant of the PyTorch build)
_AFTER = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect) \
    if hasattr(torch._C, "_dispatch_keyset_full_after") else None


def _call(op, args, kwargs):
    """Runs op's kernel for the backend of its tensors (what the dispatcher
    would call after BackendSelect), leaving the thread's dispatch state
    as it is for what runs inside."""
    t = _first_tensor(args)
    if t is None:
        ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    else:
        ks = torch._C._dispatch_keys(t) & _AFTER
    return op.redispatch(ks, *args, **kwargs)


def _first_tensor(args):
    for a in args:
        while isinstance(a, (list, tuple)) and a:
            a = a[0]
        if isinstance(a, torch.Tensor):
            return a
    return None


def _real(args):
    """False while tracing with fake or meta tensors (torch.compile): then
    nothing runs and nothing is noted."""
    a = _first_tensor(args)
    return a is None or not (a.device.type == "meta" or type(a).__name__ in ("FakeTensor", "FunctionalTensor"))


try:
    from torch._C._distributed_c10d import Work as _Work
    _unbox = getattr(_Work, "unbox", None)
except ImportError:
    _unbox = None


_thread_time = time.thread_time_ns


def _work_of(out):
    """The Work a c10d operator returned: the operator hands back a
    TorchScript box; the Python Work inside is the very object the caller
    gets (and waits on)."""
    work = out[-1] if isinstance(out, tuple) else out
    if _unbox is not None and isinstance(work, torch.ScriptObject):
        try:
            work = _unbox(work)
        except Exception:
            work = None
    return work


# the all-reduces DDP's reducer issues for its buckets
_DDP = frozenset({"allreduce_", "allreduce_coalesced_"})


def _c10d_kernel(op, name, active):
    recv = name in _RECV
    p2p = recv or name in _SEND
    ddp = name in _DDP

    def kernel(*args, **kwargs):
        prof = active()
        if prof is None:
            return _call(op, args, kwargs)
        comm = prof.comm
        g = comm.tls
        if ddp and g.ddp is not None:
            # a DDP model's bucket, measured from its reducer: counted
            # (and marked as any collective on a sampled backward)
            g.ddp += 1
            if not g.ddp_mark:
                return _call(op, args, kwargs)
        if not _real(args):
            return _call(op, args, kwargs)
        if g.comm:
            out = _call(op, args, kwargs)
            if g.fname is None:
                comm.sync_ops[name] = False  # (a call inside another c10d call: never past our kernel)
            else:  # inside a functional collective: past our kernel only with it
                comm.inner_ops.add((g.fname, name))
                box = g.inner
                if box is not None:  # (CPU) its work
                    w = _work_of(out)
                    if w is not None:
                        box.append(w)
            return out
        cell = comm.issue(recv)
        cpu0 = _thread_time() if cell is not None and not recv and not prof.cuda else None
        g.comm = True
        try:
            out = _call(op, args, kwargs)
        finally:
            g.comm = False
        if cell is not None:
            work = _work_of(out)
            sync = False
            if cpu0 is not None:
                comm.started(cell, cpu0, work)
                sync = _waited_at_once()
            comm.track(cell, work, p2p, sync, not recv)
            if not p2p and not (ddp and g.ddp is not None):  # (a DDP bucket: the reducer times it)
                seen = comm.sync_ops
                if seen.get(name, True):
                    seen[name] = sync  # (all its calls waited at once: past our kernel between samples)
        return out
    return skip_dynamo(kernel)


def _waited_at_once():
    """(In a kernel, on CPU.) Whether the Python function that issued the
    collective waits on it before it returns: a torch.distributed function
    called with ``async_op=False`` (its local), as FSDP2 calls them on CPU.
    It is the nearest of the few Python frames above the kernel with such
    a local (a dispatch mode's frames may lie between: the FLOP count's
    are four). False where none says (DDP's reducer issues from C++)."""
    try:
        f = sys._getframe(2)  # (1: the kernel; 2: the Python code that called the operator)
        for _ in range(6):
            if f is None:
                return False
            if "async_op" in f.f_code.co_varnames:
                return f.f_locals.get("async_op") is False
            f = f.f_back
    except Exception:
        pass
    return False


def _functional_kernel(op, name, active):
    recv = name in _F_RECV

    def kernel(*args, **kwargs):
        prof = active()
        if prof is None or prof.comm.tls.comm or not _real(args):
            return _call(op, args, kwargs)
        comm = prof.comm
        cell = comm.issue(recv)
        cpu0 = _thread_time() if cell is not None and not recv and not prof.cuda else None
        g = comm.tls
        g.comm = True
        g.fname = name
        box = g.inner = [] if cpu0 is not None else None
        try:
            out = _call(op, args, kwargs)
        finally:
            g.comm = False
            g.inner = g.fname = None
        if cell is not None:
            if cpu0 is not None:
                comm.started(cell, cpu0)
            comm.functional_issued(cell, out, args, recv, name)
            if box:
                comm.functional_works(cell, box)
        return out
    return skip_dynamo(kernel)


def _wait_kernel(op, active):
    def kernel(*args, **kwargs):
        prof = active()
        if prof is None or not _real(args):
            return _call(op, args, kwargs)
        t0 = prof.comm.now()
        out = _call(op, args, kwargs)
        if t0 is not None:
            prof.comm.functional_waited(args[0] if args else None, t0)
        return out
    return skip_dynamo(kernel)


def _patch_wait(active):
    """Times the host blocked in ``Work.wait()`` (the synchronous API waits
    there, as do FSDP2 and pipelining)."""
    try:
        from torch._C._distributed_c10d import Work
    except ImportError:
        return
    inner = Work.wait
    if getattr(inner, "_tpsprof", False):
        return

    def wait(self, *args, **kwargs):
        prof = active()
        if prof is None:
            return inner(self, *args, **kwargs)
        t0 = prof.comm.now()
        try:
            return inner(self, *args, **kwargs)
        finally:
            if t0 is not None:
                prof.comm.work_waited(self, t0)
    wait._tpsprof = True
    wait.__doc__ = inner.__doc__
    Work.wait = skip_dynamo(wait)
