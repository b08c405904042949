"""The communication component of the in-process profiler: each
collective's span, from the backend taking it to its completion, and the
time the training thread blocks on it (docs/capture.md).

Its marks are called from where collectives pass: the dispatcher kernels
(``_c10d``, PyTorch 2), the ``torch.distributed`` wrappers and DDP's comm
hook (``_patches``, PyTorch 1.13). It reaches the profiler only through
its public seam (``off``, ``cuda``, ``current``, ``mark_now()``,
``open_step()``, ``failed()``), and owns what it keeps: the works in
flight, the functional collectives waiting for their ``wait_tensor``, and
the poller thread that notes completions on CPU. Every mark never raises
into the training process: a failure is counted (``failed``). The
profiler counts the training thread's time in these marks as its own
(``capture_ns``): tpsprof.torch wraps them.
"""

import collections
import functools
import os
import threading
import time
import weakref

import torch

from . import _c10d, _guard
from ._intervals import intersect, length
from ._sender import Poller

__all__ = ["Comm", "reducer_timed"]

_engine = torch.autograd.Variable._execution_engine  # autograd's (queue_callback)


def _first():
    """TPSPROF_COMM_SAMPLE_FIRST: how many steps (and DDP backward passes)
    mark every collective before sampling starts (10)."""
    try:
        return max(int(os.environ.get("TPSPROF_COMM_SAMPLE_FIRST", "10")), 1)
    except ValueError:
        return 10


# DDP models whose gradient all-reduces are measured around the reducer's
# wait for them (reducer_timed): no mark per bucket between samples
_REDUCER_TIMED = []  # weak references (a WeakSet's iteration cost ~3 us a backward)
# (PyTorch 2) a reducer-timed backward whose buckets are marked one by one,
# to measure the part the backward hides: the first SAMPLE_FIRST (as DDP
# times its own first ten: the warm-up's backward passes vary most, with
# recompilations and rebuilt buckets), then the 16th, 32nd, 64th, ... and
# one in SAMPLE_EVERY (each costs the per-bucket path's ~50 us a bucket):
# sampled(). Between two, a step carries the median of the last CARRIED
# samples' hidden parts: an estimate (the exposed part is measured every
# step). Carrying the last sample alone let one outlier stand for the next
# forty steps: in a 30-step compiled DDP job on 2 cores, whose ranks took
# turns waiting for each other, the 10th backward's 46 ms against ~10 ms
# after it (gloo's own events) read 0.71-2.2x the steps' communication.
SAMPLE_FIRST = _first()
SAMPLE_EVERY = 50
CARRIED = 5
# Functional collectives past our kernels between samples (Comm.past) are
# timed by their wait_tensor, the exposed part, and the part of the span
# that compute hid before it is carried from the sampled steps: the
# median over their last HIDDEN_KEPT collectives of the same output shape
# (carried)
HIDDEN_KEPT = 256


def _key(t):
    """A functional collective's output, as the carried hidden parts are
    kept by: its element count and dtype (one call site's, on sampled
    steps and between them alike; a bypassed wait does not know which
    operator issued it)."""
    return (t.numel(), t.dtype) if isinstance(t, torch.Tensor) else None


def carried(samples):
    """The hidden parts carried to the steps between samples, from the
    last sampled ones' (shape key, ns): the median of each shape's, and
    under None the median of all (a shape no sample saw)."""
    by = {}
    for k, v in samples:
        by.setdefault(k, []).append(v)
    out = {k: _lower_median(v) for k, v in by.items()}
    out[None] = _lower_median([v for _, v in samples]) if samples else 0
    return out


def _lower_median(v):
    v = sorted(v)
    return v[(len(v) - 1) // 2]


def sampled(n):
    """Whether the (n+1)th synchronised backward of reducer-timed models
    marks each bucket (PyTorch 2)."""
    return n < SAMPLE_FIRST or n % SAMPLE_EVERY == 0 or (n & (n - 1)) == 0


_UNHIDDEN = ("DDP's all-reduces on CPU on torch 1.13: the part the backward hides (a comm hook would "
             "time each bucket, ~50 us a bucket: TPSPROF_DDP_BUCKETS=hook)")


def reducer_timed(model):
    """Measures the gradient all-reduces of ``model``, a DDP model on CPU,
    with no mark per bucket on most steps: a step's exposed part runs from
    autograd's end (every gradient computed) to the end of DDP's own wait
    for its buckets (two callbacks; Comm.grads_done). The part the backward
    hides is, on PyTorch 2, the buckets' spans measured on sampled steps
    (``sampled``), carried to the steps
    between; on 1.13 no bucket passes anything of ours (a comm hook would
    run Python for each, ~50 us), so that part is not measured there and
    the run says so. Whether a backward synchronises: on 1.13 DDP's count
    of such forwards (``num_iterations``); on PyTorch 2 (no such count)
    DDP's flag that its forward prepared the reducer
    (``require_forward_param_sync``), whose buckets then skip our kernels
    (``_c10d.set_ddp_bypass``), or on a sampled backward whether its
    all-reduces passed our kernel. The per-bucket path this replaces ran
    Python for every bucket: its marks, a future's callback, the poller's
    look at its work (~3 ms a step of the training thread for 13 buckets
    on 1.13 on this machine). False where the model is on a GPU (each
    bucket is timed there: its CUDA events), where DDP does not all-reduce
    from its reducer's buckets (compiled autograd's Python reducer, every
    gradient delayed to one all-reduce), or TPSPROF_DDP_BUCKETS=hook."""
    try:
        if os.environ.get("TPSPROF_DDP_BUCKETS") == "hook":
            return False
        it = getattr(model, "num_iterations", None)
        if it is not None and it.__class__ is not int:
            return False
        if any(p.is_cuda for p in model.parameters()):
            return False
        if getattr(model, "_use_python_reducer", False) or getattr(model, "_delay_all_reduce_all_params", False):
            # (PyTorch 2) all-reduces that are not the reducer's buckets:
            # compiled autograd's Python reducer, or every gradient in one
            # all-reduce after the backward; its forward leaves DDP's flag
            # (require_forward_param_sync) as it was: each is timed instead
            return False
        if getattr(model, "_tpsprof_ddp", None) is None:  # (registered again: kept)
            # synchronised forwards seen (None: told at the dispatcher), the
            # hidden part (ns) carried (None: never measured, or not
            # measurable), the last CARRIED samples of it
            model._tpsprof_ddp = [it, None, []]
        if not any(r() is model for r in _REDUCER_TIMED):
            _REDUCER_TIMED[:] = [r for r in _REDUCER_TIMED if r() is not None] + [weakref.ref(model)]
        return True
    except Exception:
        return False


class Comm:
    """The steps' communication (a component of TorchProfiler, ``prof.comm``)."""

    def __init__(self, prof, tls):
        self.prof = prof
        self.tls = tls  # the profiler's per-thread guards (the kernels' re-entry)
        self.poller = None  # (CPU) the thread that polls works in flight, once one is
        self.recv_works = {}  # id(work) -> (work, span cell, is a receive) of works in flight
        self.fpending = {}  # functional collectives issued: output data_ptr -> (cell, step, recv)
        # (CPU) the works of synchronous collectives (the torch.distributed
        # API's default, FSDP2's on CPU), handed to no one yet: (cell,
        # works). The API waits on each at once, which ends its span;
        # handing it to the poller would wake that thread for nothing,
        # ~40 us of the training thread's time a collective on a busy host.
        # One still open at the next collective or phase boundary is
        # handed over then (handoff)
        self.held = []
        self.ddp_backwards = 0  # synchronised backward passes of reducer-timed DDP models
        self.bypassed = False  # DDP's all-reduces past our kernels now (_c10d.set_ddp_bypass)
        # (CPU, PyTorch 2) c10d operator -> whether each of its calls on
        # this sampled step was waited on at once by its caller: those are
        # past our kernels on the steps between samples (step_finished)
        self.sync_ops = {}
        # (CPU, PyTorch 2) on this sampled step: the functional operators
        # called, and the (functional, c10d) operator pairs of the c10d
        # calls they made; on the last sampled steps, the part of each
        # functional collective's span before its wait_tensor (ns, the
        # last HIDDEN_KEPT, with its output's shape key), and their
        # medians by shape, carried to the steps between
        self.fops = set()
        self.inner_ops = set()
        self.fhidden = collections.deque(maxlen=HIDDEN_KEPT)  # (shape key, ns)
        self.fcarried = {}  # shape key -> the median of its samples; None -> of all
        # what past() decided after the last sampled step, and from how
        # many operators (decided again once one more is seen), put back
        # at a step's end where a sampled backward took it off
        self.decided = None, ((), ())
        self.sync_bypassed = False  # some are now (_c10d.set_sync_bypass)
        self.steps = 0  # steps ended in this process
        self._said_sync = False  # the run told that they are (_say_sync)
        prof.on_step_end(self.step_finished)

    def sweep(self):
        """The training thread's look at the works in flight (a phase
        boundary): see Poller.sweep."""
        if self.held:
            self.handoff()
        if self.poller is not None:
            self.poller.sweep()

    def handoff(self):
        """The held works whose spans no wait has ended go to the poller."""
        held, self.held = self.held, []
        items = [h for h in held if h[0][1] is None]
        if items:
            self.poller.watch_all(items)

    def cpu_ns(self):
        """CPU time of the poller thread (0 without one)."""
        return self.poller.cpu_ns() if self.poller is not None else 0

    def step_finished(self):
        """(A step ended; the training thread.) Whether the next step
        marks each synchronous collective (``sampled``: the first 10, the
        16th, 32nd, ... and one in 50) or times those of the operators
        that were all synchronous on the last sampled step by their waits
        alone, past our kernels: on CPU such a collective is handed to
        gloo and waited on at once, so its wait is its span (less the
        issuing call's own host work, which is not communication). The
        kernel's path costs a collective ~40-60 us of the training
        thread's time on PyTorch 2 (FSDP2 issues two or three a layer)."""
        self.steps += 1
        if not _c10d.installed or self.prof.cuda:
            return
        if sampled(self.steps):
            if self.sync_bypassed:
                self.sync_bypassed = _c10d.set_sync_bypass(())
            self.sync_ops, self.fops, self.inner_ops = {}, set(), set()
            self.decided = None, ((), ())
            return
        seen = (len(self.sync_ops), len(self.fops), len(self.inner_ops), len(_REDUCER_TIMED))
        if self.decided[0] != seen:  # (not every step: past() sorts and loops)
            self.decided = seen, (self.past() if self.sync_ops or self.fops or _REDUCER_TIMED else ((), ()))
        names, functional = self.decided[1]
        if (names or functional) and not self.sync_bypassed:
            self.sync_bypassed = _c10d.set_sync_bypass(names, functional)
            if self.sync_bypassed and not self._said_sync:
                # (said: those timed by their waits, not DDP's buckets alone)
                timed = set(self.sync_ops) | {n for _, n in self.inner_ops}
                said = ["_c10d_functional::" + f for f in functional] + [n for n in names if n in timed]
                if said:
                    self._said_sync = True
                    self._say_sync(said)

    def past(self):
        """The operators to put past our kernels between samples, from the
        last sampled step: (c10d, functional). A c10d operator every call
        of which was waited on at once; a functional one every call of
        which was waited on (wait_tensor), with the c10d operators it
        called. Neither where one of them must keep our kernel: a c10d
        operator also called asynchronously, or inside a functional
        collective that stays, and a functional collective left unwaited.
        While a DDP model is measured from its reducer, its all-reduces
        (every call outside its backward passes synchronous, or none) are
        past our kernels for whole steps too: its buckets are timed by the
        reducer, any other call by its wait. One registration when the
        samples stop, not two every backward (~50-75 us a step on torch
        2.14 in place: PyTorch recomputes the operator's dispatch table).
        The functional collectives' carried hidden part is set here too."""
        inner = self.inner_ops
        kept = {n for n, v in self.sync_ops.items() if not v}
        _REDUCER_TIMED[:] = [r for r in _REDUCER_TIMED if r() is not None]  # (models gone: not this job's)
        ddp = bool(_REDUCER_TIMED)
        unwaited = {v[2] for v in self.fpending.values()}
        functional = self.fops - unwaited
        self.fcarried = carried(self.fhidden)
        while True:
            kept |= {n for f, n in inner if f not in functional}
            if ddp and kept & _c10d._DDP:
                kept |= _c10d._DDP  # (DDP's bypass comes on for each backward instead)
            stay = {f for f, n in inner if n in kept and f in functional}
            if not stay:
                break
            functional -= stay
        names = {n for n, v in self.sync_ops.items() if v} | {n for f, n in inner if f in functional}
        if ddp and not kept & _c10d._DDP:
            names |= _c10d._DDP
        return sorted(names - kept), sorted(functional)

    def _say_sync(self, names):
        """Rank 0 says, once, that synchronous collectives are timed by
        their waits between sampled steps (run metadata ``hooks``, the
        family ``sync_collectives``; the functional ones first: the report
        says their hidden part is carried)."""
        _guard.note("sync_collectives", "waits between samples: " + ", ".join(names)[:80])
        c = self.prof.client
        if c.rank == 0:
            hooks = {k: v[:100] for k, v in _guard.installed().items()}
            self.prof.later(lambda: c.meta(hooks=hooks))

    def stop(self):
        if self.bypassed:
            self.bypassed = _c10d.set_ddp_bypass(False)
        if self.sync_bypassed:
            self.sync_bypassed = _c10d.set_sync_bypass(())
        if self.poller is not None:
            if self.held:
                self.handoff()
            self.poller.stop()

    @staticmethod
    def any_reducer_timed():
        """True when a DDP model's buckets are measured from its reducer
        (reducer_timed): backward passes are then timed by autograd's
        hooks, whose callback sees the gradients done before DDP waits."""
        return bool(_REDUCER_TIMED)

    def backward_started(self, st):
        """(The forward's output gradient is ready: a backward of step st
        begins.) The dispatcher kernels count a reducer-timed DDP model's
        all-reduces from now, to say whether it synchronises (PyTorch 2),
        and on a sampled backward mark each as well."""
        if _REDUCER_TIMED and not self.prof.cuda:
            g = self.tls
            g.ddp = 0
            n = self.ddp_backwards
            g.ddp_mark = sampled(n)
            g.ddp_from = len(st.comm)
            if g.ddp_mark:
                if self.ddp_past():
                    # a sampled backward on a step past our kernels (a
                    # backward not the step's first): its buckets marked
                    self.sync_bypassed = _c10d.set_sync_bypass(())
            elif _c10d.installed and not self.ddp_past():
                # between samples DDP's buckets skip our kernels (~40 us
                # each on PyTorch 2); whether the backward synchronises is
                # then DDP's own flag (grads_done)
                self.bypassed = _c10d.set_ddp_bypass(True)

    def ddp_past(self):
        """Whether DDP's all-reduces are past our kernels now: for this
        backward (bypassed) or for whole steps (past)."""
        return self.bypassed or (self.sync_bypassed and _c10d.sync_past("allreduce_"))

    def window_closed(self):
        """(The optimizer's step.) No backward's all-reduces are counted
        past it (a backward that raised left its count open)."""
        self.tls.ddp = None
        if self.bypassed:
            self.bypassed = _c10d.set_ddp_bypass(False)

    def grads_done(self, st, start, end):
        """(Autograd's first callback, every gradient of the backward
        computed at ``end``; the backward began at ``start``.) A
        reducer-timed DDP model whose forward synchronises this backward
        waits for its buckets in a callback queued after ours (when its
        last bucket was ready): one queued now runs after that wait."""
        g = self.tls
        issued, g.ddp = g.ddp, None
        if not _REDUCER_TIMED or self.prof.cuda:
            return
        queued = False
        try:
            for r in _REDUCER_TIMED:
                m = r()
                if m is None:
                    continue
                seen = m._tpsprof_ddp
                if seen[0] is None and self.ddp_past():
                    # (PyTorch 2, past our kernels) DDP's own flag: its
                    # forward prepared the reducer for this backward
                    synced = getattr(m, "require_forward_param_sync", False) is True
                    marked = False
                elif seen[0] is None:
                    synced = bool(issued)  # its all-reduces passed the dispatcher
                    issued = 0  # (one model's: what was counted is not told apart)
                    marked = g.ddp_mark
                else:
                    it = m.num_iterations  # DDP counts the forwards that synchronise their backward
                    synced = it != seen[0]
                    seen[0] = it
                    marked = False
                if synced:
                    # (the exposed part from now: our callback's own time
                    # before it is ours, capture_ns, not DDP's)
                    _engine.queue_callback(functools.partial(
                        self.reducer_done, st, start, end, self.prof.mark_now(), m, g.ddp_from if marked else -1))
                    queued = True
        except Exception:
            self.prof.failed()
        if self.bypassed and not queued:
            self.bypassed = _c10d.set_ddp_bypass(False)  # no wait of DDP's follows

    def reducer_done(self, st, start, done, queued, m, first):
        """(Autograd's callback after DDP's wait for its buckets.) The
        step's communication: from our first callback's end (``queued``)
        to now, exposed, and before the backward's compute end (``done``)
        the part the backward hid, as carried. A sampled backward
        (``first``: its buckets' cells in st.comm from there) measures
        that part instead: its buckets are all complete now."""
        try:
            end = self.prof.mark_now()
            if self.bypassed:
                self.bypassed = _c10d.set_ddp_bypass(False)  # (every bucket done)
            seen = m._tpsprof_ddp
            self.ddp_backwards += 1
            if first >= 0:
                self.sweep()  # (complete: DDP waited for them)
                cells = [(c[0], c[1] if c[1] is not None else end) for c in st.comm[first:]]
                got = seen[2]
                got.append(length(intersect(cells, [(start, done)])))
                del got[:-CARRIED]
                seen[1] = _lower_median(got)  # (one of them)
                return
            if seen[0] is not None and seen[1] is None:
                seen[1] = 0  # (1.13: said once)
                self.prof.unmeasured("communication", _UNHIDDEN)
            if seen[1]:
                st.comm.append([max(start, done - seen[1]), done])
            st.comm.append([queued, end])
        except Exception:
            self.prof.failed()

    def now(self):
        """A mark now, or None when no step is being measured."""
        if self.prof.off or self.prof.current is None:
            return None
        try:
            return self.prof.mark_now()
        except Exception:
            self.prof.failed()
            return None

    def issue(self, recv=False):
        """A collective is issued: its span's cell [start, end], kept in the
        step (a receive opens the step: a later pipeline stage's first
        activity is waiting for its input)."""
        if self.prof.off:
            return None
        try:
            if self.held:
                self.handoff()  # (not waited on at once: asynchronous)
            st = self.prof.current
            if st is None or st.optimized:
                if not recv:
                    return None  # before any step, or after the iteration's optimizer step: in no step
                st = self.prof.open_step()
            cell = [self.prof.mark_now(), None]
            if not recv:
                st.comm.append(cell)
            return cell
        except Exception:
            self.prof.failed()
            return None

    def started(self, cell, cpu0, work=None):
        """The issuing call returned; ``cpu0`` was this thread's CPU clock
        (``time.thread_time_ns``) before it. On CPU a collective's span
        starts when the backend has it: after the call's own host work
        (gloo's reduce-scatter, done as an all-reduce, first copies its
        inputs into one flat buffer: 0.7-1.1 ms of a 4 ms collective in the
        FSDP2 test job), which is the host's, not communication. That work
        is the CPU time the thread spent in the call; time it spent
        waiting there (to get the GIL back, or a core, after handing the
        collective over: up to 4 ms seen on this 2-core machine) is not,
        so the start is the issue plus that CPU time, at most the return.
        A collective that completed inside the call (a backend that runs
        it synchronously) keeps its issue time. On a GPU the issue mark is
        an event on the issuing stream, which the collective's stream
        waits for: unchanged."""
        try:
            if cpu0 is None or (work is not None and work.is_completed()):
                return
            cell[0] = min(cell[0] + time.thread_time_ns() - cpu0, self.prof.mark_now())
        except Exception:
            self.prof.failed()

    def track(self, cell, work, recv=False, sync=False, span=True):
        """Ends cell when work completes; a point-to-point work (``recv``)
        is remembered so that waiting on it counts as pipeline wait. sync:
        the call that issued it waits on it at once (its wait ends the
        span). span: cell is a span of communication; a receive's is not
        (issue), and nothing watches for its end."""
        try:
            if work is not None and (recv or not self.prof.cuda):
                # waiting on the work also ends its span: some works (gloo's
                # reduce-scatter done as an all-reduce) report completion
                # only once waited on. (On a GPU its future's event ends it;
                # only a receive's is kept there, for its wait's kind: a
                # work held keeps its output tensors alive.)
                if len(self.recv_works) >= 4096:
                    self.recv_works.clear()
                self.recv_works[id(work)] = (work, cell, recv)
            if span:
                self.end([cell[0], None, self.prof.current, False], work, cell, sync)
        except Exception:
            self.prof.failed()

    def p2p_blocked(self, cell, t0):
        """A blocking send or receive (PyTorch 1.13's wrappers) returned:
        the time in it was waiting for the other stage; a send's span
        ends here."""
        try:
            st = self.prof.current
            if st is None or t0 is None:
                return
            end = self.prof.mark_now()
            cell[1] = end
            st.pp_wait.append((t0, end))
        except Exception:
            self.prof.failed()

    def work_waited(self, work, t0):
        try:
            st = self.prof.current
            if st is None:
                return
            iv = (t0, self.prof.mark_now())
            got = self.recv_works.pop(id(work), None)
            if got is None and self.sync_bypassed:
                # a synchronous collective past our kernels (step_finished):
                # its wait is its span
                st.comm.append(list(iv))
            # (host marks only: CUDA events have no order to compare)
            if got is not None and (got[1][1] is None or (not self.prof.cuda and got[1][1] > iv[1])):
                # complete by the time wait() returned: a poller that saw
                # it later (starved of a core or of the GIL) is overruled
                got[1][1] = iv[1]
            if got is not None and got[2]:
                st.pp_wait.append(iv)
            else:
                st.blocked.append(iv)
        except Exception:
            self.prof.failed()

    def functional_issued(self, cell, out, args, recv, name):
        try:
            t = out[0] if isinstance(out, (list, tuple)) else out
            if not isinstance(t, torch.Tensor):
                t = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if t is None:
                return
            if len(self.fpending) > 4096:
                self.fpending.clear()
            self.fpending[t.data_ptr()] = (cell, recv, name)
            if not self.prof.cuda and not recv:
                self.fops.add(name)  # (a receive is waiting for a stage: never past our kernel)
        except Exception:
            self.prof.failed()

    def functional_works(self, cell, works):
        """(CPU) The works of the c10d calls a functional collective made:
        its span ends when they complete, or at its wait_tensor if that
        comes first (gloo's reduce-scatter completes only once waited on)."""
        try:
            st = self.prof.current
            if st is not None:
                self.end([cell[0], None, st, False], works, cell)
        except Exception:
            self.prof.failed()

    def functional_waited(self, t, t0):
        """A functional collective's wait_tensor returned: on the issuing
        stream (or the host, on CPU) the collective is complete now."""
        try:
            end = self.prof.mark_now()
            got = self.fpending.pop(t.data_ptr(), None) if isinstance(t, torch.Tensor) else None
            st = self.prof.current
            if got is None:
                if st is not None:
                    if self.sync_bypassed:
                        # a functional collective past our kernels (past):
                        # its wait is its exposed span, and before it the
                        # part compute hid, as carried for its shape
                        c = self.fcarried
                        st.comm.append([t0 - c.get(_key(t), c.get(None, 0)), end])
                    st.blocked.append((t0, end))
                return
            cell = got[0]
            if not self.prof.cuda and not got[1]:
                # (a sampled step) the span's part before the wait
                self.fhidden.append((_key(t), max(min(t0, cell[1] or t0) - cell[0], 0)))
            if cell[1] is None or (not self.prof.cuda and cell[1] > end):
                cell[1] = end  # complete by now, if the poller saw it later
            if st is not None:
                (st.pp_wait if got[1] else st.blocked).append((t0, end))
        except Exception:
            self.prof.failed()

    def begin(self, sync):
        if self.prof.off:
            return None
        st = self.prof.current
        if st is None:
            return None
        return [self.prof.mark_now(), None, st, sync]

    def end(self, tok, work, cell=None, sync=False):
        st = tok[2]
        if cell is None and (work is None or tok[3]):
            end = self.prof.mark_now()
            tok[1] = end
            st.comm.append(tok[:2])
            st.blocked.append((tok[0], end))
            return
        if work is None:
            cell[1] = self.prof.mark_now()
            return
        # asynchronous: ends when the work's future completes
        if cell is None:
            cell = [tok[0], None]
            st.comm.append(cell)
        works = work if isinstance(work, list) else [work]
        if not self.prof.cuda:
            # On CPU (gloo) a completion callback would run on gloo's own
            # threads, where Python's garbage collector may then free gloo
            # objects and abort the process; a thread of ours polls instead.
            if self.poller is None:
                self.poller = Poller()
            if sync:
                self.held.append((cell, works))
            else:
                self.poller.watch(cell, works)
            return
        try:
            futs = [w.get_future() for w in works]
        except Exception:
            cell[1] = self.prof.mark_now()  # no future: the issue time only
            return
        left = [len(futs)]
        lock = threading.Lock()

        def done(fut):
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                try:
                    # NCCL completes the future as it enqueues, with the
                    # current stream waiting for the collective: this event
                    # is reached when the collective is done.
                    cell[1] = self.prof.mark_now()
                except Exception:
                    cell[1] = cell[0]

        for f in futs:
            f.add_done_callback(done)
