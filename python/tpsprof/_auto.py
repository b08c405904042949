"""Zero-code mode: instrument an unmodified PyTorch training script.

``tpsprof launch --auto -- torchrun train.py`` puts tpsprof/_boot on the
PYTHONPATH with TPSPROF_AUTO=1; its sitecustomize calls :func:`arm`, which
waits for ``torch`` to be imported and then calls :func:`install`:

* the first optimizer the script creates gets its ``step`` hooked: each
  call ends a training step;
* every DataLoader's iterators time ``next`` (data wait) and count tokens;
* the outermost modules called with gradients on are timed (forward and
  backward): global module hooks find them during the first step, then
  hooks on those modules alone replace the global ones; a model compiled
  with torch.compile is found without them (it owns the optimizer's
  parameters), before or after the optimizer is made;
* DDP models get the timing comm hook where the dispatcher does not see
  every collective (PyTorch 1.13); collectives are timed as in
  tpsprof.torch.

The profiler is created when the first optimizer is (the process is then a
training worker, not torchrun's launcher). Nothing here raises into the
script: a failure to install leaves the script running uninstrumented.
"""

import os
import sys
import threading
import types

from . import _active, _imports

__all__ = ["arm", "install", "profiler"]

_lock = threading.Lock()  # one profiler made, whichever thread makes the first optimizer


def profiler():
    """The profiler of this process (tpsprof.torch's active one; None before
    the first optimizer)."""
    return _active.profiler


def _ensure(optimizer):
    """The active profiler, made (with its root finder) at the first optimizer."""
    from . import torch as tt
    prof = _active.profiler
    if prof is None:
        with _lock:
            prof = _active.profiler
            if prof is None:
                prof = tt.TorchProfiler()
                _Roots(prof).start(optimizer)
    return prof


def _param_ids(optimizers):
    return {id(p) for o in optimizers for g in o.param_groups for p in g["params"]}


def _owns(model, ids):
    """model holds every parameter in ids (the optimizer's): it is the
    model being trained, or a wrapper of it."""
    try:
        return bool(ids) and ids <= {id(p) for p in model.parameters()}
    except Exception:
        return False


class _Roots:
    """Finds the outermost modules of the training forward pass with global
    module hooks, then moves the timing hooks onto those modules alone."""

    def __init__(self, prof):
        self.prof = prof
        self.local = threading.local()
        self.roots = []
        self.handles = []

    def start(self, optimizer):
        import torch.nn.modules.module as mm
        from . import _patches
        # A model compiled before its optimizer was made: watch the
        # compiled wrapper, no global hooks (dynamo would see them at its
        # first call, and their removal after the first step would cost a
        # recompilation).
        ids = _param_ids([optimizer])
        for m in _patches.compiled_modules():
            if _owns(m, ids):
                self.prof.watch_model(m)
                return
        if not hasattr(mm, "register_module_forward_pre_hook"):
            return
        from ._c10d import skip_dynamo
        skip_dynamo(self.pre)
        skip_dynamo(self.post)
        self.handles = [mm.register_module_forward_pre_hook(self.pre), mm.register_module_forward_hook(self.post)]
        self.prof.root_finder = self  # a framework callback that knows the forward better stops it (stop)
        self.prof.on_step_end(self._after_step)

    def _after_step(self):
        if self.handles:
            self.settle()

    def pre(self, module, inputs):
        if _compiling():
            return
        d = getattr(self.local, "depth", 0)
        self.local.depth = d + 1
        if d == 0:
            if module not in self.roots:
                self.roots.append(module)
            self.prof._fwd_pre(module, inputs, {})  # (a global hook sees no keyword arguments)

    def post(self, module, inputs, output):
        if _compiling():
            return
        d = getattr(self.local, "depth", 1) - 1
        self.local.depth = max(d, 0)
        if d == 0:
            self.prof._fwd_post(module, inputs, output)

    def adopt(self, model):
        """torch.compile(model) while the global hooks search: when model
        owns the watched optimizers' parameters, the search ends here (the
        hooks off before torch.compile sees them) and the caller watches the
        compiled wrapper. True when adopted."""
        if not self.handles or not _owns(model, _param_ids(self.prof._optimizers)):
            return False
        self.stop()
        return True

    def stop(self):
        """The global hooks off, no roots watched: a framework callback
        times the forward itself (Lightning's training_step)."""
        for h in self.handles:
            h.remove()
        self.handles = []
        self.roots = []

    def settle(self):
        """After the first training step: hooks on the roots seen, global ones off."""
        for h in self.handles:
            h.remove()
        self.handles = []
        for m in self.roots:
            if m.training:
                self.prof.watch_model(m)
        self.roots = []


def _compiling():
    from ._c10d import compiling
    return compiling()


def install():
    """Patches torch for zero-code capture (once per process: the patched
    ``Optimizer.__init__`` is marked)."""
    import torch
    # (not tpsprof.torch: a script that imports it before torch is importing
    # it now, half-initialised, and that import of torch is what called us)
    from . import _c10d, _patches

    opt_init = torch.optim.Optimizer.__init__
    if getattr(opt_init, "_tpsprof", False):
        return

    def optimizer_init(self, *args, **kwargs):
        opt_init(self, *args, **kwargs)
        try:
            p = _ensure(self)
            p.watch_optimizer(self)  # every optimizer: an iteration steps them all
        except Exception:
            pass
    optimizer_init._tpsprof = True
    torch.optim.Optimizer.__init__ = optimizer_init

    dl = torch.utils.data.DataLoader
    dl.__iter__ = _patches.timed_iter(dl.__iter__)

    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    if ddp is not None:
        ddp_init = ddp.__init__

        def ddp_initialise(self, *args, **kwargs):
            ddp_init(self, *args, **kwargs)
            try:
                # (as watch_model: from its reducer on CPU; on a GPU a comm
                # hook only where the dispatcher does not see every
                # collective, PyTorch 1.13)
                _patches.ddp_buckets(self, _c10d.installed)
            except Exception:
                pass
        ddp.__init__ = ddp_initialise
    _patches.install_collectives()
    _patches.patch_compile()  # a compiled model is found without global hooks
    _imports.after_import("accelerate.data_loader", _watch_read_ahead_loaders)
    _imports.after_import("transformers.trainer", _trainer_callback)


def _trainer_callback(module):
    """Every Hugging Face Trainer (its subclasses too) gets tpsprof's
    callback unless it has one: the Trainer's own token count (labels
    after the shift), its evaluations and saves as events, and tracker rows
    at its global_step. Without it, a zero-code Trainer job's tokens came
    from the forward's inputs and its rows sat one step behind its loss."""
    cls = getattr(module, "Trainer", None)
    init = cls.__dict__.get("__init__") if isinstance(cls, type) else None
    if init is None or getattr(init, "_tpsprof", False):
        return

    def trainer_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        try:
            from .hf import TpsprofCallback
            handler = getattr(self, "callback_handler", None)
            if handler is not None and not any(isinstance(c, TpsprofCallback) for c in handler.callbacks):
                self.add_callback(TpsprofCallback())
        except Exception:
            pass  # never into the job: zero-code mode measures it without
    trainer_init._tpsprof = True
    trainer_init.__wrapped__ = init
    cls.__init__ = trainer_init


# Loaders of frameworks that wrap a DataLoader and read it one batch ahead
# inside their own iterator (Accelerate's DataLoaderShard fetches the next
# batch before it yields the current one, to know the last): watched at
# the DataLoader alone, each step counted the next step's first
# micro-batch and the last step lacked its own. Their own iterators are
# timed instead: a fetch inside another's is not the loop's (LoaderIter).
_READ_AHEAD = types.MappingProxyType({"accelerate.data_loader": ("DataLoaderShard", "DataLoaderDispatcher")})


def _watch_read_ahead_loaders(module):
    from . import _patches
    for name in _READ_AHEAD.get(module.__name__, ()):
        cls = getattr(module, name, None)
        orig = cls.__dict__.get("__iter__") if isinstance(cls, type) else None
        if orig is not None and not getattr(orig, "_tpsprof", False):
            cls.__iter__ = _patches.timed_iter(orig)


def _install_now(module):
    try:
        install()
    except Exception as e:  # the script runs on, uninstrumented
        sys.stderr.write("tpsprof: zero-code capture not installed: %r\n" % (e,))


def arm():
    """Installs now if torch is loaded, else when it is."""
    if os.environ.get("TPSPROF_AUTO", "") not in ("1", "true", "yes", "on"):
        return
    if "torch" in sys.modules:
        install()
    else:
        sys.meta_path.insert(0, _imports.AfterImport("torch", _install_now))
