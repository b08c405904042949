"""The loop's step life, the part of the in-process profiler the training
loop's hooks mark (tpsprof._marks.Marks): where a step begins (the end of
the rank's previous step: a step is the loop's period) and ends (its last
optimizer step, settled at the next iteration's first activity), its
phases (data wait, forward, loss, backward, optimizer), the evaluation,
checkpoint and trace-stop gaps between steps, and a skipped optimizer
step. ``tpsprof.torch.TorchProfiler`` extends ``Loop`` and composes the
components it calls (``comm``, ``flops``, ``capture``, ``batches``,
``memory``, ``layout``, ``clock``): the loop's state is the profiler's own
(docs/capture.md, "A step is the loop").

Every mark never raises into the training process: a failure is counted
(``_err``).
"""

import functools
import sys
import time
import types
from typing import Any

import torch

from . import _active, _c10d, _patches, _rollout
from ._gc import GCPauses
from ._hooks import InstanceMethod, first_grad_tensor, grad_hook, optimizer_step
from ._marks import Marks
from ._steps import Step

__all__ = ["Loop", "StepBlock", "timed_forward", "noted_zero_grad"]

_engine = torch.autograd.Variable._execution_engine  # autograd's (queue_callback)



def stepping_optimizer(opt):
    """The optimizer inside a framework's wrapper that really steps:
    Accelerate's AcceleratedOptimizer (``.optimizer``: its own step() runs
    every micro-batch and steps this one only when gradients sync, so a
    step hooked on the wrapper ended every micro-batch, and it skips
    Optimizer.__init__), Lightning's LightningOptimizer (``._optimizer``),
    any wrapper holding the torch optimizer it steps under one of those
    names. Followed while the inner object is a torch optimizer; the
    object itself otherwise."""
    try:
        seen = set()
        while id(opt) not in seen:
            seen.add(id(opt))
            d = getattr(opt, "__dict__", None) or {}
            inner = next((d[n] for n in ("optimizer", "_optimizer") if isinstance(d.get(n), torch.optim.Optimizer) and d[n] is not opt), None)
            if inner is None:
                return opt
            opt = inner
    except Exception:
        pass
    return opt

class Loop(Marks):
    """The step's life and phases (a base of TorchProfiler, whose
    ``__init__`` sets the state these marks use)."""

    # -- what the job marks itself (TorchProfiler's public API) -------------
    def rollout(self) -> _rollout.RolloutBlock:
        """Times the current step's generation phase (RL rollouts before the
        update; host clock: generation hands its tokens to the host anyway)
        and returns the :class:`tpsprof._rollout.Rollout` to record each
        request on (``r.request(prompt_tokens, output_tokens, token_times=...,
        start=...)``). The step's measured tokens stay the update's."""
        def done(r):
            self._in_rollout = False
            try:
                if self.off:
                    return
                if self._cur is None:
                    self._cur = self._begin()
                if self._cur.rollout is None:
                    self._cur.rollout = r
            except Exception:
                self._err()
        try:
            if not self.off:
                self._open()  # the step starts with its generation
        except Exception:
            self._err()
        cur = self._cur.rollout if self._cur is not None else None
        # forwards while generating are the rollout's, not the update's:
        # the hooks leave them alone (see _fwd_pre)
        self._in_rollout = True
        return _rollout.RolloutBlock(done, cur)

    def add_tokens(self, n: int) -> None:
        """Adds training tokens to this step, for loops whose batches do not
        come through a watched data loader (e.g. RL updates on rollouts).
        Called before the step's forward or after its optimizer step alike
        (see _declaring)."""
        try:
            if self.off:
                return
            self.batches.declare(self._declaring(self._cur is not None and self._cur.declared), tokens=n)
        except Exception:
            self._err()

    def _declaring(self, done):
        """The step a count the job declares belongs to: the one in
        progress; once its optimizer has stepped, the next one where the
        job declared that count for it already (``done``: a count made at
        the top of the loop, before the next forward), else it (a count
        made after ``optimizer.step()``). The step ends at its last
        optimizer step; before, a count at the top of the loop went to the
        step before (the first step read two steps' tokens, the last none)."""
        st = self._cur
        if st is None or (st.optimized and done):
            return self._open()
        return st

    def add_bytes(self, n: int) -> None:
        """Adds the UTF-8 length of text trained on in this step (bytes/s
        compares runs whose tokenizers differ)."""
        try:
            if self.off:
                return
            self._declaring(self._cur is not None and self._cur.bytes > 0).bytes += max(int(n), 0)
        except Exception:
            self._err()

    def add_batch(self, batch: Any) -> None:
        """Counts ``batch`` as trained in the current step (opening one if
        none is open), for frameworks that know which batch a step trains
        while their loaders read ahead (the Lightning callback): fetches
        are then timed as data wait but not counted
        (``count_fetches=False``)."""
        try:
            if not self.off:
                st = self._open()
                self.batches.declare(st, batch)
        except Exception:
            self._err()

    # -- the hooks that mark the loop ----------------------------------------
    def _watch_zero_grad(self, obj):
        """obj.zero_grad() notes a skipped optimizer step (see _zero_grad)."""
        try:
            if InstanceMethod.wrap(obj, "zero_grad", noted_zero_grad):
                self._zero_grad_of[id(obj)] = obj
        except Exception:
            pass  # an object without a __dict__: its zero_grad is not noted

    def _hook_optimizer(self, optimizer):
        if self.device is None:
            try:
                p = optimizer.param_groups[0]["params"][0]
                self._use_device(p.device)
            except Exception:
                pass
        try:
            self._place_optimizer_hooks(optimizer)
        except Exception as e:  # never into the job: said once, the job runs
            self._err()
            sys.stderr.write("tpsprof: cannot hook %s.step (%s: %s): its steps will not end tpsprof's steps; "
                             "pass the optimizer that steps, or mark steps with prof.step()\n"
                             % (type(optimizer).__name__, type(e).__name__, e))

    def _place_optimizer_hooks(self, optimizer):
        # an Optimizer subclass that skipped Optimizer.__init__ has the
        # registering methods but not their dicts: the bound method is
        # wrapped instead
        if getattr(optimizer, "_optimizer_step_pre_hooks", None) is not None and hasattr(optimizer, "register_step_post_hook"):
            self._hooks.append(optimizer.register_step_pre_hook(_c10d.skip_dynamo(lambda opt, a, kw: self._optim_pre(opt))))
            self._hooks.append(optimizer.register_step_post_hook(_c10d.skip_dynamo(lambda opt, a, kw: self._optim_post())))
            return
        # Older PyTorch: wrap the bound method (a bound method still, so that
        # LR schedulers can wrap it in turn).
        inner = optimizer.step
        prof = self

        def step(self_, *args, **kwargs):
            prof._optim_pre(self_)
            try:
                return inner(*args, **kwargs)
            finally:
                prof._optim_post()

        if getattr(inner, "_with_counter", False):
            # an LR scheduler made before us wrapped step to count calls; it
            # warns that step "has been overridden" unless the mark is there
            step._with_counter = True
        optimizer.step = types.MethodType(step, optimizer)

    # -- step life ----------------------------------------------------------
    def _begin(self):
        self.flops.step_begins()
        if self.comm.bypassed:
            self.comm.window_closed()  # (a backward that raised left DDP's all-reduces past our kernels)
        # A step runs from the end of the rank's previous step (the loop's
        # period): time outside hooked work (a get_batch from a token
        # array, logging, zero_grad) is the step's, never lost between
        # steps. Only a claimed gap breaks the chain: an evaluation or a
        # checkpoint noted since (its events cover the time until this
        # step's first activity: _flush_side), or our profiler's stop.
        chain, self._chain = self._chain, None
        if self._gc is None:
            self._gc = GCPauses()  # (on the thread that trains)
            self._gc.install()
        if chain is not None and not self._side:
            st = Step(chain[0], chain[1], self.cuda)
            st.chained = True
            st.cpu0 = chain[2]
        else:
            st = Step(self._mark(), time.time_ns(), self.cuda)
            self._gc.take()  # pauses in the gap before it are not its own
        self.capture.step_begins()
        return st

    # -- on-demand capture (tpsprof trace) ---------------------------------

    def _discard(self):
        """Drops the open step (it was not training's), and its trace."""
        st, self._cur = self._cur, None
        if st is not None:
            self.flops.end(st, False)
        self.capture.discard()

    def _settle_step(self):
        """The next iteration's first activity: an iteration whose optimizer
        has stepped is over (it ends at its last optimizer step)."""
        st = self._cur
        if st is not None and st.optimized:
            self._finish()

    def _open(self):
        """The step in progress, opening one (after settling the last)."""
        self._settle_step()
        if self._cur is None:
            self._cur = self._begin()
        return self._cur

    def _zero_grad(self):
        """zero_grad() after a backward with no optimizer step since: the
        optimizer step was skipped (non-finite gradients, a grad scaler's
        skip) and the iteration is over. Fetches made since its backward
        belong to the next iteration and move there."""
        if self.off:
            return
        try:
            st = self._cur
            if st is None or st.optimized or not st.bwd_done:
                return
            st.skipped = True
            nxt = None
            if st.tail:
                m, wall, _, n0 = st.tail[0]
                nxt = Step(m, wall, st.cuda)
                for _, _, dt, _ in st.tail:
                    nxt.data_wait += dt
                    st.data_wait -= dt
                nxt.fetches, st.fetches = st.fetches[n0:], st.fetches[:n0]
                if st.bare is not None and st.bare in nxt.fetches:
                    nxt.bare, st.bare = st.bare, None
                st.end_at = m
                st.tail = []
            self._finish()
            self._cur = nxt
        except Exception:
            self._err()

    def _side_event(self, kind, start, end):
        """Notes time spent on evaluation or checkpoints between steps (wall
        ns); consecutive calls of one kind merge, sent once training resumes."""
        got = self._side.get(kind)
        if got is None:
            self._side[kind] = [start, end]
        else:
            got[0], got[1] = min(got[0], start), max(got[1], end)

    def _flush_side(self, resumed=None):
        """Sends the evaluation and checkpoint events noted since the last
        step, as training resumes (resumed: the wall time the new step
        began; None at close). The whole gap between the two steps is
        theirs: the first begins where the last step ended (an evaluation's
        loader fetches before its first forward), each lasts until the
        next begins, the last until training resumes (the barrier after an
        evaluation, a checkpoint file closing after torch.save returned)."""
        if not self._side:
            return
        side, self._side = self._side, {}
        step = self.step_number
        spans = sorted(([kind, a, b] for kind, (a, b) in side.items()), key=lambda x: x[1])
        last = self._last_end_wall
        if last is not None and last <= spans[0][1]:
            spans[0][1] = last
        for i, x in enumerate(spans):
            nxt = spans[i + 1][1] if i + 1 < len(spans) else resumed
            if nxt is not None and nxt >= x[2]:
                x[2] = nxt
        for kind, a, b in spans:
            self._sender.put(lambda kind=kind, a=a, b=b: self.client.event(
                kind, start_unix_ns=a, end_unix_ns=max(b, a), step=None if step is None else max(step - 1, 0)))

    def _finish(self):
        st, self._cur = self._cur, None
        if st is None:
            return
        st.end = st.end_at if st.end_at is not None else self._mark()
        if st.cuda:
            # the host's time of the end mark (set with it at the last
            # optimizer step), else now
            wall_end = self._last_end_wall if st.end_at is not None and self._last_end_wall is not None else time.time_ns()
            st.end_shared = True  # the next step's start mark: released with it
        else:
            wall_end = st.wall0 + (st.end - st.t0)
        self._chain = (st.end, wall_end, st.cpu_end if st.end_at is not None else None)
        if self.cuda:
            st.mem = self.memory.step_finished(self.device)
        if self._gc is not None:
            st.gc = self._gc.take()
        if self.step_number is None:
            self.step_number = 0
        st.number = self.step_number
        if not self.layout.done:
            self.layout.after_first_step()
        if st.counter is not None or st.flops is not None:  # (a counted step: no call on the others)
            self.flops.end(st, True)
        if self.capture.tracing is not None:
            # the profiler's stop (0.3-1 s, the trace written) is not the
            # next step's: a gap, named (trace_stop) until the next step
            # begins (_flush_side)
            self._chain = None
            t0 = time.time_ns()
            self.capture.end()
            self._side_event("trace_stop", t0, time.time_ns())
        self.step_number += 1
        st.own, st.own_comm = self.cost.step_finished()
        self._sender.put(st)  # the sender sends it once its times are known
        for fn in self._step_end_hooks:
            try:
                fn()
            except Exception:
                self._err()

    # -- hooks --------------------------------------------------------------

    def _fwd_pre(self, module, inputs, kwargs=None):
        if self.off or _c10d.compiling():
            return
        if self._in_rollout:
            return
        try:
            if not torch.is_grad_enabled() or not module.training:
                # evaluation: the training step before it is over; a step
                # that only fetched data for it was evaluation's
                self._settle_step()
                st = self._cur
                now = time.time_ns()
                start = now
                if st is not None and not st.trained:
                    start = st.wall0
                    self._discard()
                if st is None or not st.trained:
                    self._side_event("eval", start, now)
                    self._eval_open = True
                    self._eval_since = True
                return
            st = self._open()
            st.bwd_open = None  # (a backward that raised: its callback never ran)
            if st.optim_open is not None:
                # a forward inside optimizer.step(closure) (Lightning, LBFGS):
                # the update starts after the closure's backward, not here
                st.optim_open = None
                st.closure = True
            if not st.trained:
                self._flush_side(st.wall0)
                self._eval_since = False
            self.batches.forward(st, module, inputs, kwargs)
            first = not st.trained
            st.trained = True
            st.fwd_open = self._mark()
            if first and st.chained and not st.fetched:
                # no timed fetch gave the batch (get_batch from a token
                # array, tensors in a list): the time from the step's start
                # to its first forward is its data wait
                st.pre = (st.t0, st.fwd_open)
                if st.cpu0 is not None:
                    # of it, the thread's own CPU work (host work, not a wait),
                    # and our hooks' time (finishing the last step: the
                    # sender's start, a first connection), no one's wait
                    st.pre_cpu = time.thread_time_ns() - st.cpu0
                    st.pre_own = self.cost.since_step()
            if first and self.capture.tracing is None:
                # the counter's start (~7 ms) after the marks: in the
                # (counted, left out) step's forward, never in its data wait
                self.flops.first_forward(st)
            self.comm.sweep()
        except Exception:
            self._err()

    def _fwd_post(self, module, inputs, output):
        if self.off or _c10d.compiling():
            return
        try:
            if self._eval_open:
                self._eval_open = False
                self._side_event("eval", time.time_ns(), time.time_ns())
            st = self._cur
            if st is None or st.fwd_open is None:
                return
            end = self._mark()
            st.fwd.append((st.fwd_open, end))
            st.fwd_open = None
            self.comm.sweep()
            if self._bwd_call:
                return  # the backward is timed around Tensor.backward (see _backward)
            t = first_grad_tensor(output)
            if t is not None:
                grad_hook(t, functools.partial(self._bwd_start, st, end))
        except Exception:
            self._err()

    def _backward(self, inner, t, args, kwargs):
        """``t.backward(...)`` while the profiler is active: the loss noted
        and, once the loop is known to run its backward through here with
        no collective inside (one process, or DDP's no_sync micro-batches),
        the backward timed around the call: a mark before, a mark after,
        no hook per forward (what the output hook and autograd's callback
        cost: ~14 us a step on torch 1.13). A backward that issues a
        collective (DDP's buckets, FSDP's reduce-scatters, tensor-parallel
        reductions) is timed by the hooks from then on: only autograd's
        callback sees the gradients done before DDP waits for its buckets."""
        st = self._cur
        if st is None or not st.trained or st.optimized:
            return inner(t, *args, **kwargs)
        try:
            _patches.loss_of(self, st, t)
        except Exception:
            self._err()
        if not self._bwd_call:
            nb, nc = len(st.bwd), len(st.comm)
            out = inner(t, *args, **kwargs)
            # the watched output's backward ran inside this call, with no
            # collective: later steps time it here
            if len(st.bwd) > nb and len(st.comm) == nc and not self._bwd_hooks_only and not self.comm.any_reducer_timed():
                self._bwd_call = True
            self._closure_backward_returned(st)
            return out
        start = self._mark()
        nc = len(st.comm)
        out = inner(t, *args, **kwargs)
        try:
            if len(st.comm) > nc:
                # collectives inside: the gradients were done by the last
                # one's issue (DDP's last bucket); hooks from now on
                end = st.comm[-1][0]
                self._bwd_call = False
                self._bwd_hooks_only = True
            else:
                end = self._mark()
            if st.fwd:
                st.loss.append((st.fwd[-1][1], start))  # between forward and backward: the loss
            self._bwd_end(st, start, end)
            self._closure_backward_returned(st)
        except Exception:
            self._err()
        return out

    def _closure_backward_returned(self, st):
        """A backward inside optimizer.step(closure) returned (Lightning's
        automatic optimisation): the update starts now, not when autograd
        computed the gradients (_bwd_end): DDP waits for its buckets in
        between, and that wait (for the slower rank) was booked as the
        update's time ("waiting for slower peers 0.0%" with a rank 100 ms
        slow)."""
        if st.closure and st.optim_open is not None:
            st.optim_open = self._mark()

    @_c10d.skip_dynamo
    def _bwd_start(self, st, fwd_end, grad):
        """(Autograd, the forward's output gradient is ready.)"""
        try:
            if st.bwd_open is not None:
                # the same backward reached a second watched output (the
                # model's, after the loss module's): its callback is queued,
                # and a second would end it twice (DDP's wait timed twice)
                return
            start = self._mark()
            st.bwd_open = start
            st.loss.append((fwd_end, start))  # between forward and backward: the loss
            # Runs when autograd has computed every gradient, before DDP
            # waits for its buckets (its callback is queued later).
            _engine.queue_callback(functools.partial(self._bwd_done, st, start))
            self.comm.backward_started(st)
        except Exception:
            self._err()

    @_c10d.skip_dynamo
    def _bwd_done(self, st, start):
        """(Autograd, every gradient computed.)"""
        try:
            st.bwd_open = None
            end = self._mark()
            self._bwd_end(st, start, end)
            self.comm.grads_done(st, start, end)
        except Exception:
            self._err()

    def _bwd_end(self, st, start, end):
        """A backward pass of step st ran from start to end."""
        st.bwd.append((start, end))
        st.bwd_done = True
        if st.closure:
            st.optim_open = end  # inside optimizer.step: the update follows
        st.tail = []
        self.comm.sweep()

    def _optim_pre(self, opt):
        if self.off:
            return
        try:
            if self.step_number is None and not self._first_step_given:
                self.step_number = max(optimizer_step(o) for o in self._optimizers or [opt])
            if self._cur is None:
                self._cur = self._begin()
                self._flush_side(self._cur.wall0)
            if self._cur.counter is not None:
                self.flops.stop(self._cur)
            self._cur.optim_open = self._mark()
            self.comm.window_closed()
            self.comm.sweep()
        except Exception:
            self._err()

    def _optim_post(self):
        if self.off:
            return
        try:
            st = self._cur
            if st is None:
                return
            if st.optim_open is not None:
                end = self._mark()
                st.optim.append((st.optim_open, end))
                st.optim_open = None
                st.end_at = end
                # where the step's record will say it ended (its wall start
                # plus its marks' span, on CPU; the host's clock on a GPU)
                self._last_end_wall = st.wall0 + (end - st.t0) if not st.cuda else time.time_ns()
                # (CPU) the thread's CPU clock there: the next step's host
                # work before its forward is counted from it
                st.cpu_end = None if st.cuda else time.thread_time_ns()
            # the iteration may step other optimizers yet: it ends at the
            # next iteration's first activity (or close)
            st.optimized = True
        except Exception:
            self._err()

    def _data_enter(self, src=None):
        """Called as ``next`` starts (src: which iterator): opens a step if
        none is open. Returns whether it did (undone if the iterator turns
        out to be exhausted)."""
        if self.off:
            return False
        try:
            st = self._cur
            if st is not None and not st.optimized:
                if st.bwd_done:
                    # after a backward: the next micro-batch, or the first
                    # fetch of the next iteration if this one's step is skipped
                    return (self._mark(), time.time_ns())
                if not (self._eval_since and not st.trained and src is not None and st.src is not None and src != st.src):
                    return False
                # an evaluation broke out of its loader after a fetch it
                # never evaluated: that fetch's step was evaluation's, and
                # training's begins at this fetch of another loader
                self._side_event("eval", st.wall0, st.wall0)  # (the gap rule extends it: _flush_side)
                self._discard()
            else:
                self._settle_step()
            self._cur = self._begin()
            self._cur.src = src
            return True
        except Exception:
            self._err()
            return False

    def _data_end(self, opened):
        """The iterator is exhausted: the step its ``next`` opened, or the
        open one it would have continued, ends without a batch (dropped)."""
        if opened and not self.off:
            try:
                st = self._cur
                self._discard()
                if st is not None and st.chained and not st.trained:
                    # an epoch's end: the next epoch's first step begins
                    # where the last one ended (the new iterator is its time)
                    self._chain = (st.t0, st.wall0, st.cpu0)
            except Exception:
                self._err()

    def _data_exit(self, opened, dt, batch):
        if self.off:
            return
        try:
            st = self._cur
            if st is None:
                return
            st.data_wait += dt
            st.fetched = True
            if opened.__class__ is tuple:
                st.tail.append((opened[0], opened[1], dt, len(st.fetches)))
            if self.batches.count_fetches:
                self.batches.fetched(st, batch)
        except Exception:
            self._err()


class StepBlock:
    def __init__(self, prof):
        self.prof = prof

    def __enter__(self):
        p = self.prof
        try:
            if not p.off:
                p._open()
        except Exception:
            p._err()
        return p

    def __exit__(self, *exc):
        try:
            self.prof._finish()
        except Exception:
            self.prof._err()
        return False


def timed_forward(call):
    def forward(self, *args, **kwargs):
        if _c10d.compiling():
            # dynamo traces it (a compiled module that calls this one): the
            # inner forward at once, nothing added to the graph
            inner = self._tpsprof_inner_forward
            return type(self).forward(self, *args, **kwargs) if inner is None else inner(*args, **kwargs)
        prof = _active.profiler
        if prof is None or prof._models.get(id(self), (None,))[0] is not self:
            return call(self, args, kwargs)  # closed, or a copy of a watched module
        prof._fwd_pre(self, args, kwargs)
        out = call(self, args, kwargs)
        prof._fwd_post(self, args, out)
        return out
    return forward


def noted_zero_grad(call):
    def zero_grad(self, *args, **kwargs):
        prof = _active.profiler
        if prof is not None and prof._zero_grad_of.get(id(self)) is self:
            prof._zero_grad()
        return call(self, args, kwargs)
    return _c10d.skip_dynamo(zero_grad)
