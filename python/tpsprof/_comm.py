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

import functools
import threading
import time
import weakref

import torch

from ._sender import Poller

__all__ = ["Comm", "reducer_timed"]

_engine = torch.autograd.Variable._execution_engine  # autograd's (queue_callback)

# DDP models whose gradient all-reduces are measured from the backward's
# end and the reducer's own timing (reducer_timed): no Python per bucket
_REDUCER_TIMED = []  # weak references (a WeakSet's iteration cost ~3 us a backward)
# DDP's own timer of the overlap of its all-reduces with the backward's
# compute (ns), which it sets for its sampled iterations: the first ten,
# then every hundredth (its logging data's sample rate)
_OVERLAP = "backward_compute_comm_overlap_time"


def reducer_timed(model):
    """Measures the gradient all-reduces of ``model``, a DDP model on CPU,
    without our marks per bucket: a step's exposed part runs from
    autograd's end (every gradient computed) to the end of DDP's own wait
    for its buckets, and the part the backward hides is DDP's own timer of
    it (read on its sampled iterations). Whether a backward synchronises:
    DDP's count of such forwards (``num_iterations``, PyTorch 1.13), or
    (PyTorch 2, no such count) whether its all-reduces passed the
    dispatcher during the backward (the kernel counts them and returns).
    The per-bucket path it replaces, a comm hook (1.13) or our marks at
    the dispatcher (2.x), ran Python for every bucket: its marks, a
    future's callback, the poller's look at its work (~3 ms a step of the
    training thread for 13 buckets on 1.13 on this machine). False where
    the model lacks DDP's timers or is on a GPU (there each bucket is
    timed: its CUDA events)."""
    try:
        it = getattr(model, "num_iterations", None)
        if it is not None and it.__class__ is not int:
            return False
        if not callable(getattr(model, "_get_ddp_logging_data", None)):
            return False
        if any(p.is_cuda for p in model.parameters()):
            return False
        # synchronised forwards seen (None: told at the dispatcher), the
        # overlap (ns) DDP last timed, the synchronised backward passes seen
        model._tpsprof_ddp = [it, 0, 0]
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

    def sweep(self):
        """The training thread's look at the works in flight (a phase
        boundary): see Poller.sweep."""
        if self.poller is not None:
            self.poller.sweep()

    def cpu_ns(self):
        """CPU time of the poller thread (0 without one)."""
        return self.poller.cpu_ns() if self.poller is not None else 0

    def stop(self):
        if self.poller is not None:
            self.poller.stop()

    @staticmethod
    def reducer_timed():
        """True when a DDP model's buckets are measured from its reducer
        (reducer_timed): backward passes are then timed by autograd's
        hooks, whose callback sees the gradients done before DDP waits."""
        return bool(_REDUCER_TIMED)

    def backward_started(self):
        """(The forward's output gradient is ready: a backward begins.) The
        dispatcher kernels count a reducer-timed DDP model's all-reduces
        from now, to say whether it synchronises (PyTorch 2)."""
        if _REDUCER_TIMED and not self.prof.cuda:
            self.tls.ddp = 0

    def window_closed(self):
        """(The optimizer's step.) No backward's all-reduces are counted
        past it (a backward that raised left its count open)."""
        self.tls.ddp = None

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
        try:
            for r in _REDUCER_TIMED:
                m = r()
                if m is None:
                    continue
                seen = m._tpsprof_ddp
                if seen[0] is None:
                    synced = bool(issued)  # its all-reduces passed the dispatcher
                    issued = 0  # (one model's: what was counted is not told apart)
                else:
                    it = m.num_iterations  # DDP counts the forwards that synchronise their backward
                    synced = it != seen[0]
                    seen[0] = it
                if synced:
                    # (the exposed part from now: our callback's own time
                    # before it is ours, capture_ns, not DDP's)
                    _engine.queue_callback(functools.partial(self.reducer_done, st, start, end, self.prof.mark_now(), m))
        except Exception:
            self.prof.failed()

    def reducer_done(self, st, start, done, queued, m):
        """(Autograd's callback after DDP's wait for its buckets.) The
        step's communication: from our first callback's end (``queued``)
        to now, exposed; before the backward's compute end (``done``), the
        part DDP last timed as hidden by the backward (at most the
        backward)."""
        try:
            end = self.prof.mark_now()
            seen = m._tpsprof_ddp
            seen[2] += 1
            it = seen[0] if seen[0] is not None else seen[2]  # (DDP's count, or ours)
            if it <= 12 or it % 100 <= 2:  # DDP timed a recent iteration: read it (~15 us)
                v = m._get_ddp_logging_data().get(_OVERLAP)
                if v.__class__ is int and v >= 0:
                    seen[1] = v
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

    def track(self, cell, work, recv=False):
        """Ends cell when work completes; a receive's work is remembered so
        that waiting on it counts as pipeline wait."""
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
            self.end([cell[0], None, self.prof.current, False], work, cell)
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

    def functional_issued(self, cell, out, args, recv):
        try:
            t = out[0] if isinstance(out, (list, tuple)) else out
            if not isinstance(t, torch.Tensor):
                t = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if t is None:
                return
            if len(self.fpending) > 4096:
                self.fpending.clear()
            self.fpending[t.data_ptr()] = (cell, recv)
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
            if got is not None and (got[0][1] is None or (not self.prof.cuda and got[0][1] > end)):
                got[0][1] = end  # complete by now, if the poller saw it later
            st = self.prof.current
            if st is not None:
                (st.pp_wait if got is not None and got[1] else st.blocked).append((t0, end))
        except Exception:
            self.prof.failed()

    def begin(self, sync):
        if self.prof.off:
            return None
        st = self.prof.current
        if st is None:
            return None
        return [self.prof.mark_now(), None, st, sync]

    def end(self, tok, work, cell=None):
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
