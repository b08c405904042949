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
import os
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple, Union

import torch

from . import _active, _c10d, _client, _patches
from ._clock import Clock
from ._cost import DETAIL as COST_DETAIL, Cost, owned
from ._c10d import COLLECTIVES
from ._comm import Comm
from ._capture import TraceCapture, every_env as _trace_every_env, watch_job_profilers
from ._flops import FlopSampler
from ._batches import FINGERPRINT_STEPS, Batches
from ._memory import MemoryPeaks
from ._records import Records
from ._hooks import InstanceMethod
from ._loop import Loop, StepBlock, stepping_optimizer, timed_forward
from ._sender import Sender
from ._tokens import count_tokens, packed_seq_sq
from ._topology import JobLayout, job_topology, mesh_topology



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
    # inside a functional collective on CPU: the works of the c10d calls
    # it makes, which end its span when they complete (else None)
    inner = None
    fname = None  # inside a functional collective: its operator's name
    # inside the backward of a DDP model measured from its reducer
    # (PyTorch 2): the all-reduces its buckets passed the dispatcher with
    # (else None; _comm.reducer_timed)
    ddp = None
    ddp_mark = False  # (there) a sampled backward: each all-reduce marked as well
    ddp_from = 0  # (there) the step's communication cells before the backward


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


class TorchProfiler(Loop):
    """Measures the steps of one rank's PyTorch loop; see :func:`instrument`.
    The patches and callbacks mark it through Marks (tpsprof/_marks.py);
    the step's life and phases are Loop's (tpsprof/_loop.py)."""

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
        self.cost = Cost()  # the training thread's time in our hooks: a component (_cost)
        self.clock = Clock()  # the steps' marks: a component (_clock)
        self._use_device(torch.device(device) if device is not None else None)
        self.errors = 0
        self.steps = 0
        self.pending_dropped = 0
        self.off = False
        self._cur = None
        self._pending = collections.deque()
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
        self._step_end_hooks = []  # called after each step ends (on_step_end)
        # the steps' communication: a component (_comm), reached through
        # the seam below (current, mark_now, open_step, failed)
        self.comm = Comm(self, self._tls)
        self._scaled = {}  # id(a grad scaler's scaled loss) -> (weakref to it, its scale)
        self._watched_loaders = weakref.WeakSet()  # loaders watched through their class's __iter__
        # FLOPs counted by PyTorch on sampled steps (torch >= 2.1): a
        # component (_flops), reached through the seam below
        self.flops = FlopSampler(self)
        self._said_unmeasured = set()  # measures said to be missing (run metadata)
        # what other parts of the package register (no module writes the
        # profiler's private state: ModuleStateTest.test_no_private_writes)
        self.root_finder = None  # zero-code mode's search for the model's roots (_auto._Roots)
        # the allocator's peaks per step (CUDA): a component (_memory)
        self.memory = MemoryPeaks()
        if COST_DETAIL:
            self.memory.read = self.cost.timed("memory", self.memory.read)
        # the records, built on the sender's thread: a component (_records)
        self.records = Records(self)
        _patches.install_collectives()
        _patches.install_loss()
        _patches.install_checkpoints()
        _patches.install_pipelining()
        _patches.install_ends()
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
            InstanceMethod.wrap(model, "forward", timed_forward)
            self._models[id(model)] = (model, ())
            self.batches.model_watched(model)  # the first one's inputs count, without a loader
        self._watch_zero_grad(model)
        _patches.patch_compile()
        ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
        inner = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if ddp is not None and (isinstance(model, ddp) or isinstance(inner, ddp)):
            _patches.ddp_buckets(model if isinstance(model, ddp) else inner, _c10d.installed)

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
        optimizer = stepping_optimizer(optimizer)
        if any(o is optimizer for o in self._optimizers):
            return
        self._optimizers.append(optimizer)
        self._watch_zero_grad(optimizer)
        if self._optimizer is not None:
            self._hook_optimizer(optimizer)
            return
        self._optimizer = optimizer
        self._hook_optimizer(optimizer)

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

    def step(self) -> StepBlock:
        """A context manager that marks one training step, for loops without
        an optimizer given to :func:`instrument`."""
        return StepBlock(self)

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
        host nanoseconds elsewhere (Clock)."""
        self.clock.use(device)
        self.device, self.cuda, self._mark = device, self.clock.cuda, self.clock.mark
        if COST_DETAIL:
            self._mark = self.cost.timed("mark", self._mark)

    @property
    def mark_calls(self):
        """On a GPU, how marks are recorded (Clock.calls)."""
        return self.clock.calls

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
        self.clock.recycle(events)

    def sender_cpu_base(self):
        """On the sender's thread, what its CPU clock started at (negated:
        added to thread_time_ns it gives the thread's own time); None on
        another thread."""
        if threading.current_thread() is not self._sender._thread:
            return None
        return self._sender.cpu_base

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

    def send_finished(self, timeout: float = 2.0) -> None:
        """(The process group torn down, a SIGTERM: the process may never
        iterate again.) The last step is finished (when its update ran)
        and the steps finished are sent, at most timeout seconds. Never
        raises."""
        try:
            if not self._closed and threading.current_thread() is threading.main_thread():
                self._settle_step()
            self._sender.settled(timeout)
        except Exception:
            self._err()

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


# The hooks the training loop runs through (the calls PyTorch or our
# patches make into the profiler). Left out: a backward called through
# Tensor.backward (_backward wraps the backward itself; its own lines are
# few), and the patches' thin shims around these calls.
_OWNED = ("_fwd_pre", "_fwd_post", "_optim_pre", "_optim_post", "_data_enter", "_data_exit", "_data_end",
          "_zero_grad", "_bwd_start", "_bwd_done", "_settle_step", "_open", "_side_event", "add_tokens", "add_batch",
          "add_bytes")
for _name in _OWNED:
    setattr(TorchProfiler, _name, owned(getattr(TorchProfiler, _name)))
# the communication component's marks, counted as its profiler's own
_COMM_OWNED = ("now", "issue", "started", "track", "p2p_blocked", "work_waited", "functional_issued",
               "functional_works", "functional_waited", "begin", "end", "reducer_done")
for _name in _COMM_OWNED:
    setattr(Comm, _name, owned(getattr(Comm, _name), component=True))
_c10d.skip_dynamo(TorchProfiler._fwd_pre)  # the wrappers share one code object: skipped once for all


