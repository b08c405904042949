"""What tpsprof.torch changes in torch and in the job's objects, to see a step.

Each patch is installed once per process and marked on what it replaced
(``_tpsprof`` on the wrapper, ``_tpsprof_sub`` on a loader class), so
installing again finds it there; none keeps state of its own: at each call
it reports to the active profiler (``tpsprof._active.profiler``, the one
module-global handle) and does nothing more when there is none. What each
patch measures: docs/capture.md.

- data loaders: ``next`` of their iterators timed as data wait, the batch
  counted (LoaderIter; a loader's class swapped, or its class's ``__iter__``
  wrapped for the watched instances only);
- ``Tensor.backward`` notes the loss (and, for loops whose backward passes
  come through it, times the backward: TorchProfiler._backward), a grad
  scaler's ``scale`` its factor;
- ``torch.save``/``torch.load``, distributed checkpoint, safetensors:
  checkpoint events between steps;
- ``torch.compile`` of a watched model moves its hooks to the wrapper;
- pipelining schedules note the stage they run;
- collectives: dispatcher kernels on PyTorch 2 (tpsprof._c10d), the
  ``torch.distributed`` functions on 1.13; DDP's buckets through a comm hook.
"""

import os
import sys
import time
import types
import weakref

import torch
import torch.distributed as dist

from . import _c10d, _comm, _guard, _imports
from . import _active  # the active profiler, read at each call

def _current():
    """The active profiler, or None (what the c10d kernels ask at each call)."""
    return _active.profiler


__all__ = ["LoaderIter", "wrapped_loader_class", "watch_in_class", "loss_of", "install_checkpoints", "install_loss",
           "patch_compile", "install_pipelining", "install_collectives", "install_ends", "ddp_comm_hook", "ddp_buckets"]


class LoaderIter:
    """Times ``next`` of a data iterator; everything else is the iterator's."""

    def __init__(self, prof, it):
        self._prof = prof
        self._it = it

    def __iter__(self):
        return self

    @_c10d.skip_dynamo
    def __next__(self):
        prof = _active.profiler if self._prof is None else self._prof
        if prof is None:
            return next(self._it)
        g = prof._tls
        if g.fetch:
            # a loader fetched from inside another's next (accelerate's
            # DataLoaderShard reads its DataLoader one batch ahead): the
            # outer fetch is the training loop's
            return next(self._it)
        g.fetch = True
        try:
            opened = prof._data_enter(id(self._it))
            t = time.perf_counter_ns()
            try:
                item = next(self._it)
            except StopIteration:
                prof._data_end(opened)
                raise
            prof._data_exit(opened, time.perf_counter_ns() - t, item)
            return item
        finally:
            g.fetch = False

    def __len__(self):
        return len(self._it)

    def __getattr__(self, name):
        return getattr(self._it, name)


def wrapped_loader_class(cls):
    """A subclass of the loader class cls whose iterators time ``next``
    (made once: kept on cls itself, as ``_tpsprof_sub``)."""
    sub = cls.__dict__.get("_tpsprof_sub")
    if sub is None:
        def __iter__(self):
            return LoaderIter(None, cls.__iter__(self))
        sub = type(cls.__name__, (cls,), {"__iter__": __iter__, "_tpsprof_wrapped": True,
                                          "__module__": cls.__module__})
        cls._tpsprof_sub = sub
    return sub


def timed_iter(orig):
    """A loader class's ``__iter__`` whose iterators time ``next`` while a
    profiler is active (zero-code mode: DataLoader's, and the read-ahead
    wrappers' own)."""
    def __iter__(self):
        it = orig(self)
        return it if _active.profiler is None else LoaderIter(None, it)
    __iter__._tpsprof = True
    return __iter__


def watch_in_class(cls, loader, prof):
    """For a loader whose class cannot be swapped (accelerate's
    DataLoaderShard makes ``__class__`` a property): its class's
    ``__iter__`` times the iterators of the loaders watched and leaves the
    others' (an evaluation loader of the same class) alone."""
    orig = cls.__iter__
    if not getattr(orig, "_tpsprof", False):
        def __iter__(self):
            it = orig(self)
            prof = _active.profiler
            return LoaderIter(prof, it) if prof is not None and self in prof._watched_loaders else it
        __iter__._tpsprof = True
        cls.__iter__ = __iter__
    prof._watched_loaders.add(loader)


def loss_of(prof, st, t):
    """A backward runs from t in step st: its value when it is a loss (one element)."""
    if t.numel() != 1 or len(st.losses) >= 1024:
        return
    scaled = prof._scaled
    scale = scaled.pop(id(t), None) if scaled else None
    v = t.detach()
    if scale is not None:
        if scale[0]() is not t:
            scale = None
        else:
            v = v / scale[1]  # a grad scaler's output: the loss before scaling
    st.losses.append(v)  # one element: float() reads it on the sender thread


def side_call(kind, fn):
    """fn (a checkpoint save or load) timed as a ``kind`` event between
    steps: an iteration whose optimizer has stepped ends before it, and a
    step opened by a fetch but not yet training does not count its time."""
    def call(*args, **kwargs):
        prof = _active.profiler
        if prof is None or prof.off or prof._tls.side or _SIDES_OPEN:
            # inside another save or load, on any thread: its own part (the
            # torch.save of a DCP writer's thread; the torch.load DCP's
            # object collectives unpickle with, which read as a restore for
            # every save)
            return fn(*args, **kwargs)
        g = prof._tls
        g.side = True
        _SIDES_OPEN.append(kind)
        t0 = time.time_ns()
        try:
            prof._settle_step()
        except Exception:
            prof._err()
        try:
            return fn(*args, **kwargs)
        finally:
            g.side = False
            try:
                _SIDES_OPEN.remove(kind)
            except ValueError:
                pass
            t1 = time.time_ns()
            try:
                prof._side_event(kind, t0, t1)
                st = prof._cur
                if st is not None and not st.trained:
                    st.gap += t1 - t0
            except Exception:
                prof._err()
    call._tpsprof = True
    call.__doc__ = fn.__doc__
    call.__wrapped__ = fn
    return _c10d.skip_dynamo(call)


# The save and load calls open now, on any thread (one list for the
# process: a save's own parts may run on its writer's threads).
_SIDES_OPEN = []

_DCP_CALLS = (("save", "checkpoint_save"), ("async_save", "checkpoint_save"), ("save_state_dict", "checkpoint_save"),
              ("load", "checkpoint_restore"), ("load_state_dict", "checkpoint_restore"))
_SAFETENSORS_CALLS = (("save_file", "checkpoint_save"), ("save_model", "checkpoint_save"),
                      ("load_file", "checkpoint_restore"), ("load_model", "checkpoint_restore"))


@_guard.install("checkpoints")
def install_checkpoints():
    """torch.save / torch.load, torch.distributed.checkpoint's save and
    load and safetensors' (what framework checkpoint calls go through)
    become checkpoint events (docs/capture.md). DCP and safetensors are
    wrapped when the job imports them, before or after this: imported
    after, DCP's save went unwrapped, and its own torch.save and torch.load
    calls counted each as a save or a restore (6 restores for 3 saves)."""
    _wrap_sides([(torch, "save", "checkpoint_save"), (torch, "load", "checkpoint_restore")])
    _imports.after_import("torch.distributed.checkpoint", _wrap_dcp)
    _imports.after_import("safetensors.torch", _wrap_safetensors)


def _wrap_safetensors(mod):
    _wrap_sides([(mod, n, k) for n, k in _SAFETENSORS_CALLS])


def _wrap_dcp(_):
    targets = []
    for modname in ("torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict_saver",
                    "torch.distributed.checkpoint.state_dict_loader"):
        mod = sys.modules.get(modname)
        if mod is not None:
            targets += [(mod, n, k) for n, k in _DCP_CALLS]
    _wrap_sides(targets)


def _wrap_sides(targets):
    """Each (module, name, kind) whose function exists made a side call."""
    for mod, name, kind in targets:
        fn = getattr(mod, name, None)
        if not callable(fn) or getattr(fn, "_tpsprof", False):
            continue
        try:
            setattr(mod, name, side_call(kind, fn))
        except Exception:
            pass


@_guard.install("loss")
def install_loss():
    """Tensor.backward notes the loss (``loss.backward()``); a grad scaler's
    ``scale(loss)`` notes its factor so the unscaled loss is recorded."""
    inner = torch.Tensor.backward
    if getattr(inner, "_tpsprof", False):
        return

    def backward(self, *args, **kwargs):
        prof = _active.profiler
        if prof is None or prof.off:
            return inner(self, *args, **kwargs)
        return prof._backward(inner, self, args, kwargs)
    backward._tpsprof = True
    backward.__doc__ = inner.__doc__
    torch.Tensor.backward = _c10d.skip_dynamo(backward)
    for modname in ("torch.amp.grad_scaler", "torch.cuda.amp.grad_scaler"):
        mod = sys.modules.get(modname)
        if mod is None:
            try:
                mod = __import__(modname, fromlist=["GradScaler"])
            except Exception:
                continue
        cls = getattr(mod, "GradScaler", None)
        if cls is None or getattr(cls.scale, "_tpsprof", False):
            continue
        wrap_scale(cls)


def wrap_scale(cls):
    inner = cls.scale

    def scale(self, outputs):
        out = inner(self, outputs)
        try:
            prof = _active.profiler
            if prof is not None and isinstance(out, torch.Tensor) and out is not outputs and out.numel() == 1:
                sc = getattr(self, "_scale", None)
                if sc is not None:
                    scaled = prof._scaled
                    if len(scaled) > 64:
                        scaled.clear()
                    scaled[id(out)] = (weakref.ref(out), sc.detach().clone().reshape(()))
        except Exception:
            pass
        return out
    scale._tpsprof = True
    scale.__doc__ = inner.__doc__
    cls.scale = scale


# Modules torch.compile returned (weak references, the newest 64): zero-code
# mode may meet a model compiled before its optimizer exists.
_compiled = []


def compiled_models(models=()):
    """Whether the job compiles: a model compiled with torch.compile since
    we watched, a watched model that is compiled (torch.compile's wrapper,
    or ``model.compile()`` in place), or frames dynamo has compiled (a
    compiled function). Dynamo being loaded is not enough: transformers
    imports it."""
    if any(r() is not None for r in _compiled):
        return True
    for m in models:
        if getattr(m, "_orig_mod", None) is not None or getattr(m, "_compiled_call_impl", None) is not None:
            return True
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        c = utils.counters
        return bool(c["frames"]["total"] or c["stats"]["unique_graphs"])
    except Exception:
        return True  # counters unreadable: assume it compiles


def install_checkpoint_probe():
    """Activation checkpointing (torch.utils.checkpoint, reentrant or not,
    however the job imported ``checkpoint``) notes that the step recomputes
    activations: its counted FLOPs are then hardware FLOPs, not the model's.
    Patches the functions checkpoint() calls, looked up at each call."""
    try:
        import torch.utils.checkpoint as cp
    except Exception:
        return
    if getattr(cp, "_tpsprof_probe", False):
        return
    cp._tpsprof_probe = True

    def note():
        prof = _active.profiler
        if prof is not None:
            prof.note_recompute()
    for name in ("_checkpoint_impl", "_checkpoint_without_reentrant_generator", "_checkpoint_without_reentrant"):
        fn = getattr(cp, name, None)
        if callable(fn):
            def probe(*args, __fn=fn, **kwargs):
                note()
                return __fn(*args, **kwargs)
            probe.__wrapped__ = fn
            setattr(cp, name, probe)
    cf = getattr(cp, "CheckpointFunction", None)
    fwd = getattr(cf, "forward", None) if cf is not None else None
    if fwd is not None:
        def forward(ctx, run_function, preserve_rng_state, *args):
            note()
            return fwd(ctx, run_function, preserve_rng_state, *args)
        cf.forward = staticmethod(forward)


def compiled_modules():
    """The modules torch.compile returned that are still alive."""
    return [m for m in (r() for r in _compiled) if m is not None]


def patch_compile():
    """``torch.compile(model)`` of a watched model: its hooks move to the
    compiled wrapper, whose forward runs outside the graph. Hooks left on
    the inner module would be traced into the graph (a hook returns at once
    while dynamo traces, so the graph is unchanged, but the compiled code
    then never calls it). In zero-code mode, compiling the model that owns
    the optimizer's parameters ends the search for it with global module
    hooks before torch.compile sees them (they cost a compiled model a
    second graph and PyTorch's warning), and the compiled wrapper is
    watched. ``model.compile()`` compiles in place: its forward and
    backward are then not timed (the step, data wait, optimizer and
    communication still are)."""
    c = getattr(torch, "compile", None)
    if c is None or getattr(c, "_tpsprof", False):
        return

    def compile(model=None, *args, **kwargs):
        prof = _active.profiler
        moved = False
        if prof is not None and isinstance(model, torch.nn.Module):
            try:
                moved = prof._unwatch_model(model)
                roots = prof.root_finder
                if not moved and roots is not None:
                    moved = roots.adopt(model)
            except Exception:
                moved = False
        out = c(model, *args, **kwargs)
        if isinstance(out, torch.nn.Module):
            try:
                _compiled.append(weakref.ref(out))
                del _compiled[:-64]
            except TypeError:
                pass
        if moved:
            try:
                prof.watch_model(out if isinstance(out, torch.nn.Module) else model)
            except Exception:
                prof._err()
        return out
    compile._tpsprof = True
    compile.__doc__ = c.__doc__
    compile.__wrapped__ = c
    torch.compile = compile


@_guard.install("pipelining")
def install_pipelining():
    """torch.distributed.pipelining schedules note the stage they run (its
    group size and rank are the pipeline's) on the active profiler, at
    their first step."""
    mod = sys.modules.get("torch.distributed.pipelining.schedules")
    if mod is None:
        return
    for name in ("PipelineScheduleSingle", "PipelineScheduleMulti"):
        cls = getattr(mod, name, None)
        step = getattr(cls, "step", None)
        if step is None or getattr(step, "_tpsprof", False):
            continue

        def wrapped(self, *args, _inner=step, **kwargs):
            prof = _active.profiler
            if prof is not None:
                prof.note_pipeline_stage(self)
            return _inner(self, *args, **kwargs)
        wrapped._tpsprof = True
        wrapped.__doc__ = step.__doc__
        cls.step = _c10d.skip_dynamo(wrapped)


@_guard.install("communication")
def install_collectives():
    """Wraps the collectives of torch.distributed once per process; the
    wrappers report to the active profiler and cost one attribute read when
    none is active. Says how: "dispatcher" (PyTorch 2: every collective
    passes through the dispatcher), "functions" (the torch.distributed
    functions wrapped), False (no torch.distributed in this build)."""
    if not dist.is_available():
        return False
    if _c10d.install(_current):
        return "dispatcher"
    from torch.distributed import distributed_c10d as c10d
    # waiting on an isend's or irecv's work is waiting for the other stage
    _c10d._patch_wait(_current)
    wrapped = {}  # id(original) -> (original, wrapper)
    for name in _c10d.COLLECTIVES:
        fn = getattr(c10d, name, None) or getattr(dist, name, None)
        if fn is None or getattr(fn, "_tpsprof", False):
            continue
        w = wrap_collective(fn, name)
        wrapped[id(fn)] = (fn, w)
        for mod in (dist, c10d):
            if getattr(mod, name, None) is fn:
                setattr(mod, name, w)
    _rebind_imported(wrapped)
    return "functions"


def install_ends():
    """The last step of a process arrives whatever ends it: a finished
    step waits for the next iteration's first activity or close(), which a
    Ray Train worker that returns (the process lives on), a SIGTERM the job
    does not catch (torchrun's, Slurm's) or a job that tears its process
    group down and idles never ran (Ray Train under --auto lost its last
    step: 29 rows for 30). ``destroy_process_group`` first sends the steps
    finished (at most 2 s); a SIGTERM whose handler is the default sends
    them (at most 1 s), then ends the process as the default would.
    Installed once a process; never raises."""
    try:
        if dist.is_available() and not getattr(dist.destroy_process_group, "_tpsprof", False):
            orig = dist.destroy_process_group

            def destroy_process_group(*args, **kwargs):
                prof = _active.profiler
                if prof is not None:
                    prof.send_finished(2.0)
                return orig(*args, **kwargs)
            destroy_process_group._tpsprof = True
            dist.destroy_process_group = destroy_process_group
            from torch.distributed import distributed_c10d as c10d
            if getattr(c10d, "destroy_process_group", None) is orig:
                c10d.destroy_process_group = destroy_process_group
    except Exception:
        pass
    try:
        import signal
        import threading
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            def on_term(signum, frame):
                prof = _active.profiler
                if prof is not None:
                    try:
                        prof.send_finished(1.0)
                        prof.close(1.0)
                    except Exception:
                        pass
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)  # as the default would have: killed by the signal
            signal.signal(signal.SIGTERM, on_term)
    except Exception:
        pass


def _rebind_imported(wrapped):
    """(PyTorch 1.13.) A collective imported by name before the wrappers
    were installed (``from torch.distributed import all_reduce`` at the top
    of a training script) holds the unwrapped function: such names in the
    loaded modules (the script's ``__main__`` among them) are pointed at
    the wrappers once (they read 0 communication against 25.6 ms a step).
    torch's own modules are left as they are; names bound later import the
    wrapped function already. Never raises."""
    if not wrapped:
        return
    for mod in list(sys.modules.values()):
        try:
            name = getattr(mod, "__name__", "") or ""
            if name == "torch" or name.startswith(("torch.", "tpsprof")):
                continue
            d = getattr(mod, "__dict__", None)
            if not isinstance(d, dict):
                continue
            for k, v in list(d.items()):
                got = wrapped.get(id(v))
                if got is not None and got[0] is v:
                    d[k] = got[1]
        except Exception:
            continue


# point-to-point on PyTorch 1.13: receives, and those that return a work to wait on
_P2P = frozenset({"send", "recv", "isend", "irecv"})
_P2P_RECV = frozenset({"recv", "irecv"})
_P2P_ASYNC = frozenset({"isend", "irecv"})


def _p2p(prof, g, fn, args, kwargs, recv, returns_work):
    comm = prof.comm
    cell = comm.issue(recv)
    t0 = comm.now() if cell is not None else None
    g.comm = True
    try:
        out = fn(*args, **kwargs)
    finally:
        g.comm = False
    if cell is None:
        return out
    if returns_work and out is not None:
        comm.track(cell, out, True, span=not recv)
    else:
        comm.p2p_blocked(cell, t0)
    return out


def wrap_collective(fn, name):
    """Times a torch.distributed function (PyTorch 1.13). Point-to-point
    is measured as on PyTorch 2's dispatcher path (_c10d): the time
    blocked in a send or a receive (in the call for ``send``/``recv``, in
    ``Work.wait`` for ``isend``/``irecv``) is pipeline wait, waiting for
    the other stage; a send's span is communication, a receive's is not;
    a receive before any other activity of the step opens the step (a
    later stage's first activity is waiting for its input)."""
    p2p, recv, always_async = name in _P2P, name in _P2P_RECV, name in _P2P_ASYNC or name == "batch_isend_irecv"

    def collective(*args, **kwargs):
        prof = _active.profiler
        if prof is None or prof._tls.comm:
            return fn(*args, **kwargs)
        g = prof._tls
        if p2p:
            return _p2p(prof, g, fn, args, kwargs, recv, always_async)
        try:
            tok = prof.comm.begin(not always_async and not kwargs.get("async_op", False))
        except Exception:
            tok = None
            prof._err()
        g.comm = True
        try:
            work = fn(*args, **kwargs)
        finally:
            g.comm = False
        if tok is not None:
            try:
                prof.comm.end(tok, work)
            except Exception:
                prof._err()
        return work

    collective._tpsprof = True
    collective.__name__ = getattr(fn, "__name__", name)
    collective.__doc__ = fn.__doc__
    collective.__wrapped__ = fn
    return collective


@_guard.install("ddp_buckets")
def ddp_buckets(model, dispatcher=False):
    """How a DDP model's gradient all-reduces are measured: on CPU from its
    reducer, nothing per bucket (_comm.reducer_timed); on a GPU by the
    dispatcher's kernels (PyTorch 2) or, where collectives are wrapped
    functions (1.13: the reducer's, in C++, pass none), by the timing comm
    hook. Says which: "reducer", "dispatcher" or "comm hook"."""
    if _comm.reducer_timed(model):
        return "reducer"
    if dispatcher:
        return "dispatcher"
    ddp_comm_hook(model)
    return "comm hook"


def ddp_comm_hook(model):
    """Routes DDP's gradient buckets through a Python comm hook so their
    all-reduces go through the timed torch.distributed.all_reduce. The
    default hook's result is the same as DDP's built-in all-reduce. A comm
    hook the user registers later replaces the default inside ours."""
    if getattr(model, "_tpsprof_hooked", False):
        return
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    except ImportError:
        return
    target = {"state": None, "hook": None}
    group = getattr(model, "process_group", None)

    def tpsprof_allreduce(state, bucket):
        hook = target["hook"]
        if hook is None:
            return default_hooks.allreduce_hook(group, bucket)
        return hook(target["state"], bucket)

    try:
        model.register_comm_hook(None, tpsprof_allreduce)
    except Exception:
        return  # a hook is in place already: its collectives are timed if it calls torch.distributed
    model._tpsprof_hooked = True
    ref = weakref.ref(model)

    def register_comm_hook(self, state, hook):
        if ref() is not None:
            target["state"], target["hook"] = state, hook

    model.register_comm_hook = types.MethodType(register_comm_hook, model)
