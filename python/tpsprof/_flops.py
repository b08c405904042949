"""The FLOP sampling component of the in-process profiler: PyTorch's own
FlopCounterMode around a sampled step's forward and backward, its count
sent as the step's ``flop_count`` event (the report's counted FLOPs beside
the declared formula; the sampled step runs slower and is left out of the
figures).

It reaches the profiler only through its public seam (``failed()``,
``unmeasured(key, why)``, ``compiled()``, ``event(kind, **fields)``) and
owns what it keeps: the schedule of sampled steps, the counter of the open
step and the counters left under a dispatch mode of the job's. Nothing it
does raises into the training process: a failure is counted
(``failed``), and a counter that will not start or count is not tried
again.
"""

import os
import time

import torch

from . import _compat, _patches

__all__ = ["FlopSampler", "FLOPS_FIRST", "FLOPS_EVERY", "attention_formulas", "dispatch_modes",
           "job_profiler_running"]

# FLOPs counted by PyTorch: the third step the profiler measures (the
# first after the usual warm-up), then every TPSPROF_FLOPS_EVERY steps.
FLOPS_FIRST = 2
FLOPS_EVERY = 1000


def every_env() -> int:
    """TPSPROF_FLOPS_EVERY: steps between FLOP counts (0: never; absent:
    FLOPS_EVERY)."""
    try:
        n = int(os.environ.get("TPSPROF_FLOPS_EVERY", str(FLOPS_EVERY)) or 0)
    except ValueError:
        return FLOPS_EVERY
    return max(n, 0)


def attention_formulas() -> dict:
    """Formulas PyTorch's FLOP counter lacks or gets wrong for attention:
    the CPU flash-attention kernel (none in torch 2.14), and the CUDA
    kernels with grouped-query attention (fewer key/value heads than query
    heads), on whose shapes the formulas of torch 2.11 raise (a 0.95 B
    Llama with 16 query and 8 key/value heads on an H100; 2.14 knows
    them). PyTorch's own counts with the key and value heads broadcast to
    the query's, as the kernels do: q·kᵀ and p·v forward (a causal mask's
    zeros counted), five products backward (the scores recomputed)."""
    aten = torch.ops.aten
    try:
        from torch.utils import flop_counter as fc
        count, count_bwd = fc.sdpa_flop_count, fc.sdpa_backward_flop_count
    except Exception:
        return {}

    def heads(q, kv):
        return tuple(kv[:-3]) + (q[-3],) + tuple(kv[-2:])

    def fwd(q, k, v, *args, out_shape=None, **kwargs):
        return count(q, heads(q, k), heads(q, v))

    def bwd(grad_out, q, k, v, *args, out_shape=None, **kwargs):
        return count_bwd(grad_out, q, heads(q, k), heads(q, v))
    out = {}
    for name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"):
        f, b = getattr(aten, name, None), getattr(aten, name + "_backward", None)
        if f is not None and b is not None:
            out[f], out[b] = fwd, bwd
    return out


def guarded_formulas(failed: list) -> dict:
    """Every formula FlopCounterMode will use, each made unable to raise
    into the job's forward or backward: a formula that raises (a shape
    it does not know) counts 0 and names its operator in failed, and the
    step's count is not sent. A counter that raised would end the job's
    step (and the job) inside PyTorch's dispatch."""
    from torch.utils.flop_counter import flop_registry, shape_wrapper

    def guard(op, f):
        def counted(*args, **kwargs):
            try:
                return f(*args, **kwargs)
            except Exception as e:
                if len(failed) < 8:
                    failed.append("%s (%s)" % (op, type(e).__name__))
                return 0
        counted._get_raw = True  # f is already shape-wrapped
        return counted
    out = {op: guard(op, f) for op, f in flop_registry.items()}
    for op, f in attention_formulas().items():
        out[op] = guard(op, shape_wrapper(f))
    return out


def dispatch_modes() -> int:
    """How many Python dispatch modes are active on this thread (the job's
    FlopCounterMode, a fake tensor mode...): -1 where torch cannot say."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
        return len(_get_current_dispatch_mode_stack())
    except Exception:
        pass
    try:
        return int(torch._C._len_torch_dispatch_mode())
    except Exception:
        return -1


def top_dispatch_mode():
    """The innermost active Python dispatch mode, or None."""
    try:
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        return _get_current_dispatch_mode()
    except Exception:
        return None


def job_profiler_running() -> bool:
    """A profiler session of the job's own is on: a torch.profiler.profile
    started and not stopped, or the autograd profiler enabled (the legacy
    torch.autograd.profiler.profile, or one started before we watched)."""
    try:
        if torch.profiler.profile.__dict__.get("_tpsprof_running", 0) > 0:
            return True
        enabled = getattr(torch.autograd, "_profiler_enabled", None)
        return bool(enabled()) if enabled is not None else False
    except Exception:
        return False


class FlopSampler:
    """The sampled steps' FLOP counts (a component of TorchProfiler,
    ``prof.flops``). ``every`` is the steps between counts (0: none)."""

    def __init__(self, prof):
        self.prof = prof
        self.every = every_env()
        self.begun = 0  # steps trained (a first training forward), for the schedule
        self.recompute = False  # an activation checkpoint ran in the counted step
        self._stale = []  # (counter, its dispatch mode) left on the mode stack under a mode of the job's
        self._top = None  # the dispatch mode the open step's counter pushed

    def step_begins(self):
        """A step begins: counters left under the job's modes popped where
        they are on top again, the recompute flag cleared (the checkpoint
        probe may fire before the first forward)."""
        while self._stale and top_dispatch_mode() is self._stale[-1][1]:
            try:
                self._stale.pop()[0].__exit__(None, None, None)
            except Exception:
                self.prof.failed()
        self.recompute = False

    def first_forward(self, st):
        """Step st's first training forward: its FLOPs are counted where the
        schedule samples it. From the forward, not where the step began:
        the counter must not hold what the thread runs before (an
        inference-mode rollout, an evaluation: torch 2.14 raised from its
        dispatcher on inference tensors)."""
        if not self.every:
            return
        k = self.begun
        self.begun += 1
        if k >= FLOPS_FIRST and (k - FLOPS_FIRST) % self.every == 0:
            self.start(st)

    def start(self, st):
        """Counts step st's FLOPs under PyTorch's FlopCounterMode (matrix
        products, convolutions, attention; forward and backward, the
        backward's threads included). The step runs slower under it: the
        report leaves it out of the figures. Not on PyTorch before 2.1 (no
        counter), nor for compiled models (a dispatch mode around compiled
        code recompiles it), nor beside the job's own profiler."""
        prof = self.prof
        if not _compat.has("flop_counter"):
            self.every = 0  # PyTorch 1.13: no counter
            prof.unmeasured("counted_flops", _compat.why_not("flop_counter"))
            return
        from torch.utils.flop_counter import FlopCounterMode
        if prof.compiled():
            prof.unmeasured("counted_flops", "the model is compiled (a dispatch mode around compiled code recompiles it)")
            return
        if job_profiler_running():
            return
        if torch.is_inference_mode_enabled() or not torch.is_grad_enabled() or dispatch_modes() != 0:
            # not a training forward the thread controls, or the job's own
            # dispatch mode (its FlopCounterMode) is active: ours pushed
            # inside it would be popped by its exit (it read 0). Not counted.
            return
        try:
            _patches.install_checkpoint_probe()
            failed = []
            mode = FlopCounterMode(display=False, custom_mapping=guarded_formulas(failed))
            mode.__enter__()
            # the dispatch mode it pushed (torch 2.14's FlopCounterMode
            # pushes an inner mode of its own): what must be on top to pop it
            self._top = top_dispatch_mode()
        except Exception as e:
            self.every = 0  # a counter that will not start: not tried again
            prof.unmeasured("counted_flops", "FlopCounterMode did not start on torch %s (%s)" % (torch.__version__, type(e).__name__))
            prof.failed()
            return
        st.counter = mode
        st.uncounted = failed

    def stop(self, st):
        """Pops step st's FLOP counter and keeps its count (st.flops): at
        its first optimizer step (forward and backward are over; the
        update's element-wise work has no FLOP formula), so that no
        inference-mode forward after the update (an evaluation) runs under
        it, nor pops it from inside inference mode (which restores the
        dispatch state of its entry on exit: torch 2.14 then raised from
        its dispatcher on the next operator)."""
        if st.counter is None:
            return
        mode, st.counter = st.counter, None
        top, self._top = self._top, None
        if top_dispatch_mode() is not top:
            # a mode the job entered after ours is still active: popping
            # ours now would pop the job's (modes are a stack). Ours is
            # left to the next step boundary where it is on top
            # (step_begins); this count is not sent.
            self._stale.append((mode, top))
            return
        try:
            mode.__exit__(None, None, None)
            total = int(mode.get_total_flops())
        except Exception:
            self.every = 0
            self.prof.failed()
            return
        if st.uncounted:
            # a partial count is a wrong count: none is sent, and none tried again
            self.every = 0
            self.prof.unmeasured("counted_flops", "PyTorch's FLOP counter on torch %s has no working formula for %s"
                                 % (torch.__version__, ", ".join(st.uncounted)))
            return
        st.flops = total

    def end(self, st, send):
        """Step st ends (or is dropped): its counter stopped if it still
        runs; its count sent (a flop_count event, the step's own) when
        send."""
        if st.counter is None and st.flops is None:
            return
        self.stop(st)
        total, st.flops = st.flops, None
        if not send or total is None:
            return
        detail = '{"flops":%d%s%s}' % (total, ',"recompute":true' if self.recompute else "",
                                       ',"generation":true' if st.rollout is not None else "")
        self.prof.event("flop_count", start_unix_ns=st.wall0, end_unix_ns=time.time_ns(), step=st.number, detail=detail)
