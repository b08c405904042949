"""tpsprof.torch: every step of a PyTorch loop measured, not hand-timed.

    import tpsprof.torch
    prof = tpsprof.torch.instrument(model, optimizer, loader)
    for batch in loader:              # the loop stays as it was
        loss = model(batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

``instrument`` hooks the model (forward and backward), the optimizer (its
``step`` is the step boundary), the data loader (time blocked in ``next``,
tokens of each batch) and ``torch.distributed`` (every collective, and DDP's
gradient buckets through a comm hook). Each optimizer step becomes one rank
record with data_wait, fwd, bwd, optim, comm and exposed_comm filled in by
measurement, tokens and padded tokens from the batch.

On a GPU the times come from CUDA events recorded on the streams and read a
few steps later, when ``event.query()`` says they are done: no host
synchronisation is added to the loop. On CPU the host clock is right and is
used. docs/capture.md describes the method and what each figure means.

Nothing here raises into the training loop: a hook that fails is counted
(``prof.errors``) and, past a bound, the profiler switches itself off.
"""

import atexit
import collections
import functools
import os
import threading
import time
import types
import weakref
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, Union

import torch

from . import _active, _c10d, _client, _patches, _rollout
from ._marks import Marks
from ._c10d import COLLECTIVES
from ._gc import GCPauses
from ._comm import Comm
from ._capture import TraceCapture, every_env as _trace_every_env, watch_job_profilers
from ._flops import FlopSampler
from ._batches import FINGERPRINT_STEPS, Batches
from ._memory import MemoryPeaks
from ._records import Records
from ._hooks import InstanceMethod, first_grad_tensor, optimizer_step
from ._sender import Sender
from ._steps import Step
from ._tokens import count_tokens, packed_seq_sq
from ._topology import JobLayout, job_topology, mesh_topology

_engine = torch.autograd.Variable._execution_engine  # autograd's (queue_callback)


__all__ = ["instrument", "TorchProfiler", "active", "count_tokens", "packed_seq_sq", "job_topology", "mesh_topology",
           "COLLECTIVES", "FINGERPRINT_STEPS"]

# The profiler the patches report to (tpsprof._patches, tpsprof._c10d), one
# per process, is kept in tpsprof._active: the package's only state, all else
# is the profiler's.
_MAX_ERRORS = 100


def active() -> "Optional[TorchProfiler]":
    """The profiler of this process (the last made and not closed), or None."""
    return _active.profiler


# tokens=: a batch's tokens (an int, or real and padded)
TokenFn = Callable[[Any], Union[int, Tuple[int, int], None]]


class _Guards(threading.local):
    """Per-thread re-entry guards of the patches: a collective issued inside
    a timed one, a loader read inside another's ``next``, a checkpoint
    call inside another."""
    comm = False
    fetch = False
    side = False
    own_t0 = 0  # inside a hook whose time counts as the profiler's own (_owned): since when
    # inside a functional collective on CPU: the works of the c10d calls
    # it makes, which end its span when they complete (else None)
    inner = None


def instrument(model: Optional[torch.nn.Module] = None, optimizer: Union[None, torch.optim.Optimizer, List[torch.optim.Optimizer]] = None,
               dataloader: Any = None, *, tokens: Optional[TokenFn] = None, ignore_index: int = -100,
               first_step: Optional[int] = None, device: Any = None, trace_every: Optional[int] = None,
               **client_options: Any) -> "TorchProfiler":
    """Hooks a training loop and returns its :class:`TorchProfiler`.

    model: the module whose forward is timed (a DDP or FSDP wrapper, or a
        plain module); optional.
    optimizer: its ``step()`` ends each training step; without one, mark
        steps with ``with prof.step():``.
    dataloader: a ``torch.utils.data.DataLoader`` (instrumented in place) or
        any iterable (wrap it: ``for batch in prof.wrap(iterable)``).
    tokens: a function of a batch returning its tokens (an int, or a pair
        real, padded) when the automatic count (attention mask, labels other
        than ``ignore_index``, integer input ids) does not fit the batch.
    first_step: the number of the first step (default: the optimizer's own
        step count when it was loaded from a checkpoint, else 0).
    trace_every: profile one step in every N with torch.profiler and hand
        the trace to the node's agent, which analyses it off the training
        process (default $TPSPROF_TRACE_EVERY, else 0: off; see
        docs/kineto.md for its cost).
    client_options: job, rank, world_size, attempt, socket_path, topology
        for :class:`tpsprof.Profiler` (default: from the environment).
    """
    prof = TorchProfiler(tokens=tokens, ignore_index=ignore_index, first_step=first_step, device=device,
                         trace_every=trace_every, **client_options)
    try:
        if model is not None:
            prof.watch_model(model)
        if optimizer is not None:
            prof.watch_optimizer(optimizer)
        if dataloader is not None:
            prof.watch_loader(dataloader)
    except BaseException:
        prof.close(timeout=0)  # no half-hooked profiler left active
        raise
    return prof


class TorchProfiler(Marks):
    """Measures the steps of one rank's PyTorch loop; see :func:`instrument`.
    The patches and callbacks mark it through Marks (tpsprof/_marks.py)."""

    def __init__(self, tokens: Optional[TokenFn] = None, ignore_index: int = -100, first_step: Optional[int] = None,
                 device: Any = None, trace_every: Optional[int] = None, count_fetches: bool = True,
                 **client_options: Any) -> None:
        self.client = _client.Profiler(**client_options)
        # profiled steps, sampled and on demand: a component (_capture),
        # reached through the seam below
        self.capture = TraceCapture(self, _trace_every_env(trace_every),
                                    os.environ.get("TPSPROF_TRACE_DIR") or (self.client.path + ".traces"))
        self.client.on_control = self.capture.on_control
        # what the steps train on, counted: a component (_batches)
        self.batches = Batches(self, tokens, ignore_index, count_fetches)
        self._bwd_call = False  # backward timed around Tensor.backward (see _backward), not by hooks
        self._bwd_hooks_only = False  # a backward issued collectives: hooks it is
        self.step_number = first_step
        self._first_step_given = first_step is not None
        self.device = None
        self.own_by = {}  # (TPSPROF_OWN_DETAIL=1) ns the training thread spent, by hook
        self.mark_calls = None  # on a GPU: how marks are recorded (_cuda_mark)
        self._use_device(torch.device(device) if device is not None else None)
        self.errors = 0
        self.steps = 0
        self.pending_dropped = 0
        self.off = False
        self._cur = None
        self._pending = collections.deque()
        self._events = []  # free CUDA events
        self._hooks = []
        self._models = {}  # id(model) -> (model, ()): forward timed (InstanceMethod)
        self._zero_grad_of = {}  # id(obj) -> obj: zero_grad noted (InstanceMethod)
        self.layout = JobLayout(self)  # the job's layout, sent after the first step: a component (_topology)
        self._optimizer = None  # the first watched (numbering); all: _optimizers
        self._optimizers = []
        self._side = {}  # eval / checkpoint_save / checkpoint_restore -> [wall start, wall end] not yet sent
        self._eval_open = False
        self._eval_since = False  # an evaluation forward ran since the last training forward
        self._last_end_wall = None  # wall ns the last training step ended (its last optimizer step)
        # (mark, wall ns) where the last step ended: the next step begins
        # there (a step is the loop's period), unless a gap is claimed in
        # between (evaluation, checkpoint, our trace's stop: _begin)
        self._chain = None
        self._gc = None  # the collector's pauses on the training thread (_begin installs it)
        self._closed = False
        self._in_rollout = False
        # records are built and sent by a thread of ours, in order: the
        # training thread only decides a step is over (docs/capture.md)
        self._sender = Sender(self)
        # per-profiler state the patches use (the module keeps none)
        self._tls = _Guards()
        # the steps' communication: a component (_comm), reached through
        # the seam below (current, mark_now, open_step, failed)
        self.comm = Comm(self, self._tls)
        self._scaled = {}  # id(a grad scaler's scaled loss) -> (weakref to it, its scale)
        self._watched_loaders = weakref.WeakSet()  # loaders watched through their class's __iter__
        # what measuring costs: ns in our hooks on the training thread since
        # the last step finished (_owned); our threads' CPU: records.own_cpu
        self._own_ns = 0
        self._fin_own = 0  # of the hook that finished the last step, its time after that step's end
        # FLOPs counted by PyTorch on sampled steps (torch >= 2.1): a
        # component (_flops), reached through the seam below
        self.flops = FlopSampler(self)
        self._said_unmeasured = set()  # measures said to be missing (run metadata)
        # what other parts of the package register (no module writes the
        # profiler's private state: ModuleStateTest.test_no_private_writes)
        self.root_finder = None  # zero-code mode's search for the model's roots (_auto._Roots)
        self._step_end_hooks = []  # called after each step ends (on_step_end)
        self.own_ns = 0  # the steps' capture_ns, summed (what the profiler says it cost the training thread)
        # the allocator's peaks per step (CUDA): a component (_memory)
        self.memory = MemoryPeaks()
        if _OWN_DETAIL:
            self.memory.read = _timed(self, "memory", self.memory.read)
        # the records, built on the sender's thread: a component (_records)
        self.records = Records(self)
        _patches.install_collectives()
        _patches.install_loss()
        _patches.install_checkpoints()
        _patches.install_pipelining()
        watch_job_profilers()
        _active.profiler = self
        atexit.register(self.close)

    @property
    def token_fn(self):
        """The job's count of a batch (None: the package's rules); the
        framework callbacks set theirs."""
        return self.batches.token_fn

    @token_fn.setter
    def token_fn(self, fn):
        self.batches.token_fn = fn

    @property
    def ignore_index(self):
        return self.batches.ignore_index

    @property
    def topology(self):
        """The layout's sizes the device mesh gave (None before the first
        step, or without a mesh)."""
        return self.layout.sizes

    # -- what is watched ---------------------------------------------------
    def watch_model(self, model: torch.nn.Module) -> None:
        """Times the forward and backward passes of ``model``.

        The forward is timed by a ``forward`` of the instance's own (see
        :class:`InstanceMethod`), not module hooks: a module with forward
        hooks takes ``Module._call_impl``'s slow path, ~12 us a call on
        torch 2.14 for two empty hooks on the root (~4 us on 1.13)."""
        self._set_device_from(model)
        if id(model) not in self._models:
            InstanceMethod.wrap(model, "forward", _timed_forward)
            self._models[id(model)] = (model, ())
            self.batches.model_watched(model)  # the first one's inputs count, without a loader
        self._watch_zero_grad(model)
        _patches.patch_compile()
        ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if ddp is not None and not _c10d.installed and (isinstance(model, ddp) or isinstance(inner, ddp)):
            _patches.ddp_comm_hook(model if isinstance(model, ddp) else inner)

    def _unwatch_model(self, model):
        """Takes the hooks off model (it is about to be compiled: they move
        to the compiled wrapper); True when it was watched."""
        got = self._models.pop(id(model), None)
        if got is None or got[0] is not model:
            return False
        InstanceMethod.unwrap(model, "forward")
        return True

    def on_step_end(self, fn: Callable[[], Any]) -> None:
        """Calls fn (no arguments, on the training thread) after each step
        ends: zero-code mode moves its global hooks onto the model's roots
        after the first. An fn that raises is counted, never raised."""
        self._step_end_hooks.append(fn)

    def note_recompute(self) -> None:
        """An activation checkpoint ran (the FLOP count's step recomputes)."""
        self.flops.recompute = True

    def note_pipeline_stage(self, schedule: Any) -> None:
        """A pipelining schedule steps (JobLayout.note_stage)."""
        self.layout.note_stage(schedule)

    def count_fetches(self, on: bool) -> None:
        """Whether the watched loaders' fetches count the step's tokens
        (False where a framework hands the batch over: add_batch)."""
        self.batches.count_fetches = bool(on)

    def watch_optimizer(self, optimizer: Union[torch.optim.Optimizer, List[torch.optim.Optimizer]]) -> None:
        """Makes ``optimizer.step()`` part of each training step: an
        iteration ends at the last optimizer step (of any watched optimizer)
        before the next iteration starts; ``zero_grad()`` after a backward
        without an optimizer step ends it as skipped. Several optimizers
        (a list, or one call each) are one step."""
        if isinstance(optimizer, (list, tuple)):
            for o in optimizer:
                self.watch_optimizer(o)
            return
        if any(o is optimizer for o in self._optimizers):
            return
        self._optimizers.append(optimizer)
        self._watch_zero_grad(optimizer)
        if self._optimizer is not None:
            self._hook_optimizer(optimizer)
            return
        self._optimizer = optimizer
        self._hook_optimizer(optimizer)

    def _watch_zero_grad(self, obj):
        """obj.zero_grad() notes a skipped optimizer step (see _zero_grad)."""
        try:
            if InstanceMethod.wrap(obj, "zero_grad", _noted_zero_grad):
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
        if hasattr(optimizer, "register_step_pre_hook") and hasattr(optimizer, "register_step_post_hook"):
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

    def watch_loader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        """Instruments a DataLoader in place (its iterators time ``next``)."""
        if isinstance(loader, torch.utils.data.DataLoader):
            cls = type(loader)
            if not getattr(cls, "_tpsprof_wrapped", False):
                try:
                    loader.__class__ = _patches.wrapped_loader_class(cls)
                except (AttributeError, TypeError):
                    _patches.watch_in_class(cls, loader, self)
            return loader
        raise TypeError("tpsprof: %s is not a DataLoader; iterate over prof.wrap(it) instead" % type(loader).__name__)

    def wrap(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """An iterator over ``iterable`` whose ``next`` is timed as data wait."""
        return _patches.LoaderIter(self, iter(iterable))

    def step(self) -> "_StepBlock":
        """A context manager that marks one training step, for loops without
        an optimizer given to :func:`instrument`."""
        return _StepBlock(self)

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
        come through a watched data loader (e.g. RL updates on rollouts)."""
        try:
            if self.off:
                return
            if self._cur is None:
                self._cur = self._begin()
            self.batches.declare(self._cur, tokens=n)
        except Exception:
            self._err()

    def add_bytes(self, n: int) -> None:
        """Adds the UTF-8 length of text trained on in this step (bytes/s
        compares runs whose tokenizers differ)."""
        try:
            if self.off:
                return
            if self._cur is None:
                self._cur = self._begin()
            self._cur.bytes += max(int(n), 0)
        except Exception:
            self._err()

    # -- clocks -------------------------------------------------------------
    def _set_device_from(self, model):
        if self.device is not None:
            return
        try:
            p = next(model.parameters())
        except (StopIteration, AttributeError, TypeError):
            return
        self._use_device(p.device)

    def _use_device(self, device):
        """The device the loop trains on: marks are CUDA events on a GPU,
        host nanoseconds elsewhere (the clock itself, no call of ours)."""
        self.device = device
        self.cuda = device is not None and device.type == "cuda"
        self._mark = self._cuda_mark if self.cuda else time.perf_counter_ns
        if self.cuda:
            self._cuda_idx = device.index
            self._stream = None  # the current stream's key and Stream object (_cuda_mark)
            self.mark_calls = "direct"
            if _EVENT_RECORD is None or _CURRENT_STREAM is None:
                self._mark = self._cuda_mark_slow
                self.mark_calls = "public"
        if _OWN_DETAIL:
            self._mark = _timed(self, "mark", self._mark)

    def _cuda_mark(self):
        """A CUDA event recorded on the current stream: the C calls that
        torch.cuda.current_stream() and Event.record() make, less their
        Python (device lookup, a Stream object a call: 7 marks a step made
        them a large part of the training thread's cost on an H100). The
        Stream object is kept while the current stream stays the same."""
        ev = self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)
        try:
            idx = self._cuda_idx
            key = _CURRENT_STREAM(idx if idx is not None else _CURRENT_DEVICE())
            known = self._stream  # (key, Stream): one object, as threads mark too (autograd's)
            if known is None or known[0] != key:
                known = self._stream = (key, torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                                               device_type=key[2]))
            _EVENT_RECORD(ev, known[1])
        except Exception:  # a torch whose calls differ: the public ones from here on
            self._mark = self._cuda_mark_slow
            self.mark_calls = "public (the direct calls failed)"
            ev.record(torch.cuda.current_stream(self.device))
        return ev

    def _cuda_mark_slow(self):
        ev = self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def _err(self):
        self.errors += 1
        if self.errors > _MAX_ERRORS:
            self.off = True

    # -- the components' seam (_comm, _flops, _capture) ---------------------
    @property
    def current(self):
        """The step being measured (None between steps)."""
        return self._cur

    def mark_now(self):
        """A mark of now on the steps' clock (host ns, or a CUDA event)."""
        return self._mark()

    def open_step(self):
        """The step in progress, opening one (after settling the last): a
        receive a later pipeline stage waits on opens its step."""
        return self._open()

    def failed(self):
        """Counts a failure of a component's mark (off past too many)."""
        self._err()

    def unmeasured(self, key, why):
        """Rank 0 says, once, that a measure (a key of the report's
        tps.UnmeasuredText) could not be taken in this job, and why: the
        report prints it instead of a silent zero."""
        if self.client.rank != 0 or key in self._said_unmeasured:
            return
        self._said_unmeasured.add(key)
        self._sender.put(lambda: self.client.meta(unmeasured={key: why[:200]}))

    def compiled(self):
        """Whether a watched model is compiled (torch.compile)."""
        return _patches.compiled_models(m for m, _ in self._models.values())

    def event(self, kind, **fields):
        """Queues an event of the job's to the sender (off this thread)."""
        c = self.client
        self._sender.put(lambda: c.event(kind, **fields))

    def later(self, fn):
        """Queues fn to the sender's thread, in order with the records."""
        self._sender.put(fn)

    def batch_of(self, st):
        """(Sender thread.) A finished step's batch figures as its record
        sends them (Batches.of): the step is counted sent."""
        out = self.batches.of(st)
        self.steps += 1
        return out

    def params(self):
        """The watched optimizers' and models' parameters (the layout's
        device mesh is read from them)."""
        params = []
        if self._optimizer is not None:
            for g in self._optimizer.param_groups:
                params.extend(g["params"])
        for m, _ in self._models.values():
            params.extend(m.parameters())
        return params

    def recycle(self, events):
        """(Sender thread.) A sent step's CUDA events back to the pool."""
        seen = set()
        for ev in events:
            if id(ev) not in seen and len(self._events) < 4096:
                seen.add(id(ev))
                self._events.append(ev)

    def sender_cpu_base(self):
        """On the sender's thread, what its CPU clock started at (negated:
        added to thread_time_ns it gives the thread's own time); None on
        another thread."""
        if threading.current_thread() is not self._sender._thread:
            return None
        return self._sender.cpu_base

    # -- step life ----------------------------------------------------------

    def _begin(self):
        self.flops.step_begins()
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
        # what the hooks cost up to here is this step's (finishing it
        # included); the hook we are in goes on counting for the next
        g = self._tls
        self._fin_own = 0
        if g.own_t0:
            t = time.perf_counter_ns()
            # (the hook we are in began after this step ended: its time so
            # far lies before the next step's forward, ours, not its data wait)
            self._fin_own = t - g.own_t0
            self._own_ns += t - g.own_t0
            g.own_t0 = t
        st.own, self._own_ns = self._own_ns, 0
        self.own_ns += st.own
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
                    g = self._tls
                    st.pre_own = self._fin_own + self._own_ns + (time.perf_counter_ns() - g.own_t0 if g.own_t0 else 0)
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
                _grad_hook(t, functools.partial(self._bwd_start, st, end))
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
            if len(st.bwd) > nb and len(st.comm) == nc and not self._bwd_hooks_only:
                self._bwd_call = True
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
        except Exception:
            self._err()
        return out

    @_c10d.skip_dynamo
    def _bwd_start(self, st, fwd_end, grad):
        """(Autograd, the forward's output gradient is ready.)"""
        try:
            start = self._mark()
            st.loss.append((fwd_end, start))  # between forward and backward: the loss
            # Runs when autograd has computed every gradient, before DDP
            # waits for its buckets (its callback is queued later).
            _engine.queue_callback(functools.partial(self._bwd_done, st, start))
        except Exception:
            self._err()

    @_c10d.skip_dynamo
    def _bwd_done(self, st, start):
        """(Autograd, every gradient computed.)"""
        try:
            self._bwd_end(st, start, self._mark())
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

    # -- end ----------------------------------------------------------------
    def close(self, timeout: float = 2.0) -> None:
        """Sends what is pending (waiting for the GPU once) and disconnects."""
        if self._closed:
            return
        self._closed = True
        try:
            self._settle_step()
            # the last evaluation or checkpoint lasts until the job closes
            # (a checkpoint file still closing after torch.save returned)
            self._flush_side(time.time_ns())
        except Exception:
            self._err()
        if self._gc is not None:
            self._gc.remove()
        for h in self._hooks:
            try:
                h.remove()
            except Exception:
                pass
        for m, _ in list(self._models.values()):
            try:
                InstanceMethod.unwrap(m, "forward")
            except Exception:
                pass
        self._models.clear()
        for o in list(self._zero_grad_of.values()):
            try:
                InstanceMethod.unwrap(o, "zero_grad")
            except Exception:
                pass
        self._zero_grad_of.clear()
        if _active.profiler is self:
            _active.profiler = None
        # the sender first: it gives the poller a moment to see the last
        # collectives end before it sends the last steps
        done = self._sender.close(timeout)
        self.comm.stop()
        if done:
            self.client.close(timeout)

    @property
    def sent(self) -> int:
        return self.client.sent

    @property
    def dropped(self) -> int:
        return self.client.dropped

    def flush_for_trackers(self, timeout: float = 2.0) -> None:
        """(A tracker of the job closing: SummaryWriter.close, mlflow.end_run,
        wandb.finish.) The last step is finished (when its update ran), the
        steps finished are sent and their rows written into the job's
        trackers, at most timeout seconds. Never raises."""
        try:
            if not self._closed and threading.current_thread() is threading.main_thread():
                self._settle_step()
            self._sender.settled(timeout)
            tr = self.client.trackers
            if tr is not None:
                tr.drain_now()
        except Exception:
            self._err()

    @property
    def stats(self) -> dict:
        """What the profiler did so far: records sent to the agent and
        dropped (no agent listening, or one not reading), steps measured,
        errors of its own, and whether it switched itself off."""
        return {"sent": self.client.sent, "dropped": self.client.dropped, "steps": self.steps,
                "errors": self.errors, "off": self.off}


for _f in (TorchProfiler._fwd_pre, TorchProfiler._fwd_post, TorchProfiler._optim_pre, TorchProfiler._optim_post,
           TorchProfiler._data_enter, TorchProfiler._data_exit):
    _c10d.skip_dynamo(_f)


# The C calls behind torch.cuda.current_stream() and Event.record()
# (_cuda_mark): a (stream id, device index, device type) tuple since torch 2.
_CURRENT_STREAM = getattr(torch._C, "_cuda_getCurrentStream", None)
_CURRENT_DEVICE = getattr(torch._C, "_cuda_getDevice", None)
_EVENT_RECORD = getattr(getattr(torch._C, "_CudaEventBase", None), "record", None)
if _CURRENT_DEVICE is None:
    _CURRENT_STREAM = None

# TPSPROF_OWN_DETAIL=1: the training thread's cost split by hook (and the
# marks and memory reads inside them), in prof.own_by; a diagnostic for
# the cost benchmark (bench_torch.py), off by default (a dict update a call).
_OWN_DETAIL = os.environ.get("TPSPROF_OWN_DETAIL") == "1"


def _timed(prof, name, fn):
    now = time.perf_counter_ns

    def timed(*args):
        t = now()
        try:
            return fn(*args)
        finally:
            prof.own_by[name] = prof.own_by.get(name, 0) + now() - t
    return timed


def _owned(fn, component=False):
    """fn, a hook, with its time counted as the profiler's own (the step's
    capture_ns); a hook called inside another counts once. component: fn
    is a method of one of the profiler's components (its ``prof``)."""
    now = time.perf_counter_ns
    detail = _OWN_DETAIL
    key = fn.__name__
    if component:
        key = fn.__qualname__.split(".")[0].lower() + "." + key  # (own_by: "comm.issue")

    def hook(self, *args, **kwargs):
        p = self.prof if component else self
        g = p._tls
        if g.own_t0:
            return fn(self, *args, **kwargs)
        g.own_t0 = now()
        try:
            return fn(self, *args, **kwargs)
        finally:
            t = now() - g.own_t0
            p._own_ns += t
            if detail:
                p.own_by[key] = p.own_by.get(key, 0) + t
            g.own_t0 = 0
    hook.__name__, hook.__qualname__, hook.__doc__, hook.__wrapped__ = fn.__name__, fn.__qualname__, fn.__doc__, fn
    return hook


# The hooks the training loop runs through (the calls PyTorch or our
# patches make into the profiler). Left out: a backward called through
# Tensor.backward (_backward wraps the backward itself; its own lines are
# few), and the patches' thin shims around these calls.
_OWNED = ("_fwd_pre", "_fwd_post", "_optim_pre", "_optim_post", "_data_enter", "_data_exit", "_data_end",
          "_zero_grad", "_bwd_start", "_bwd_done", "_settle_step", "_open", "_side_event", "add_tokens", "add_batch",
          "add_bytes")
for _name in _OWNED:
    setattr(TorchProfiler, _name, _owned(getattr(TorchProfiler, _name)))
# the communication component's marks, counted as its profiler's own
_COMM_OWNED = ("now", "issue", "started", "track", "p2p_blocked", "work_waited", "functional_issued",
               "functional_works", "functional_waited", "begin", "end")
for _name in _COMM_OWNED:
    setattr(Comm, _name, _owned(getattr(Comm, _name), component=True))
_c10d.skip_dynamo(TorchProfiler._fwd_pre)  # the wrappers share one code object: skipped once for all


class _StepBlock:
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


def _timed_forward(call):
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


def _noted_zero_grad(call):
    def zero_grad(self, *args, **kwargs):
        prof = _active.profiler
        if prof is not None and prof._zero_grad_of.get(id(self)) is self:
            prof._zero_grad()
        return call(self, args, kwargs)
    return _c10d.skip_dynamo(zero_grad)


def _grad_hook(t, fn):
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
