"""Hooks' plumbing for the in-process profiler, with no state of its own:
a method set on one object's instance (how a watched module's forward is
timed and an optimizer's zero_grad noted), and what the hooks look at in
a batch, a forward's output and an optimizer's state."""

import collections
import inspect
import types

import torch

__all__ = ["InstanceMethod", "host_batch", "first_grad_tensor", "grad_hook", "optimizer_step"]


class InstanceMethod:
    """A method set on one object's instance (its ``__dict__``), around
    the one it replaces: how tpsprof times a watched module's ``forward``
    and notes ``zero_grad``.

    Why on the instance and not module hooks: a module with forward hooks
    takes ``Module._call_impl``'s slow path, ~12 us a call on torch 2.14
    for two empty hooks on the root (~4 us on 1.13); an instance ``forward``
    keeps the fast path. It is a method bound to the object
    (``types.MethodType``) so that it follows the object: ``copy.deepcopy``
    rebinds it to the copy (which is not watched: it runs its own method
    untimed), and pickling stores ``getattr(obj, name)``, so a saved module
    loads without tpsprof. The method it replaces (an instance-level one
    such as torch.compile's or accelerate's, else the class's) is kept as
    ``_tpsprof_inner_<name>``, also in ``__dict__`` (not setattr:
    OptimizedModule forwards most names to the module it compiled).
    ``inspect.signature`` sees the replaced method's signature, which
    frameworks read to pick a batch's columns."""

    @staticmethod
    def wrap(obj, name, make):
        """Sets make(inner call) as obj's method name, unless it is ours
        already; False when the object has no such method."""
        d = obj.__dict__
        cur = d.get(name)
        if getattr(getattr(cur, "__func__", None), "_tpsprof", False):
            return True
        wrapped = cur if cur is not None else getattr(type(obj), name, None)
        if wrapped is None:
            return False
        key = "_tpsprof_inner_" + name
        f = make(InstanceMethod._caller(name, key))
        f._tpsprof = True
        f.__name__ = name  # what pickling a bound method looks up
        f.__wrapped__ = wrapped
        f.__doc__ = getattr(wrapped, "__doc__", None)
        try:
            sig = inspect.signature(wrapped)
            if cur is not None:
                # an instance-level method takes no self: the bound method drops one
                sig = sig.replace(parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
                                              *sig.parameters.values()])
            f.__signature__ = sig
        except (TypeError, ValueError):
            pass  # no signature to be had: inspect then sees (*args, **kwargs)
        d[key] = cur
        d[name] = types.MethodType(f, obj)
        return True

    @staticmethod
    def unwrap(obj, name):
        """Puts back what wrap replaced, unless someone replaced ours since
        (it then stays under theirs, inert once the profiler is closed)."""
        d = obj.__dict__
        if not getattr(getattr(d.get(name), "__func__", None), "_tpsprof", False):
            return
        inner = d.pop("_tpsprof_inner_" + name, None)
        if inner is None:
            del d[name]
        else:
            d[name] = inner

    @staticmethod
    def _caller(name, key):
        def call(self, args, kwargs):
            inner = self.__dict__.get(key)
            if inner is None:
                return getattr(type(self), name)(self, *args, **kwargs)
            return inner(*args, **kwargs)
        return call


def host_batch(batch):
    """Whether a batch's tensors are all on the host (its top level: a
    tensor, or the tensors of a tuple, list or mapping); False for one
    without tensors."""
    if batch.__class__ is torch.Tensor:
        return not batch.is_cuda
    if isinstance(batch, (list, tuple)):
        items = batch
    elif hasattr(batch, "values") and callable(batch.values):
        items = batch.values()
    else:
        return False
    seen = False
    for t in items:
        if isinstance(t, torch.Tensor):
            if t.is_cuda:
                return False
            seen = True
    return seen


def first_grad_tensor(out, depth=0):
    if isinstance(out, torch.Tensor):
        return out if out.requires_grad else None
    if depth > 3:
        return None
    if isinstance(out, (list, tuple)):
        items = out
    elif hasattr(out, "values") and callable(out.values):
        items = list(out.values())
    else:
        return None
    for x in items:
        t = first_grad_tensor(x, depth + 1)
        if t is not None:
            return t
    return None


def optimizer_step(opt):
    """The optimizer's own step count (state loaded from a checkpoint), so
    that a resumed run numbers its steps where it left off: the largest
    ``step`` in its per-parameter state (Adam-like; frozen parameters have
    none) or in its parameter groups (some optimizers keep it there)."""
    best = 0
    try:
        for st in opt.state.values():
            s = st.get("step") if isinstance(st, dict) else None
            if s is not None:
                best = max(best, int(s))
        for group in opt.param_groups:
            s = group.get("step")
            if s is not None:
                best = max(best, int(s))
    except Exception:
        pass
    return best


def grad_hook(t, fn):
    """t.register_hook(fn), at half its cost for the usual output: a plain
    tensor without hooks yet gets autograd's hook dict directly (what
    register_hook builds, less the removable handle nobody uses). An
    OrderedDict, as register_hook makes it: the handles of hooks the job
    adds later hold a weak reference to it."""
    if t.__class__ is torch.Tensor and t._backward_hooks is None and t.grad_fn is not None:
        t._backward_hooks = collections.OrderedDict(((_HOOK_KEY, fn),))
        t.grad_fn._register_hook_dict(t)
    else:
        t.register_hook(fn)


_HOOK_KEY = -1  # below every id register_hook's handles take (0, 1, ...)
