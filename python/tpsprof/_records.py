"""The record output component of the in-process profiler: on the
sender's thread, a finished step's marks become its record (its phases,
measures and what the profiler says of its batch) once its times are
known, its losses on a GPU are read in one copy, and its CUDA events go
back to the profiler's pool.

It reaches the profiler only through its public seam (``client``,
``cuda``, ``device``, ``step_number``, ``comm``, ``failed()``,
``batch_of(st)``, ``recycle(events)``, ``sender_cpu_base()``) and owns what
it keeps: the stream losses are copied on, and its threads' CPU time sent
so far.
"""

import time

import torch

from ._intervals import clip, intersect, length
from ._steps import mean_loss, phases

__all__ = ["Records"]


class Records:
    """The steps' records (a component of TorchProfiler, ``prof.records``);
    every method runs on the sender's thread."""

    def __init__(self, prof):
        self.prof = prof
        self._loss_stream = None  # where losses on a GPU are copied to the host
        self._cpu_sent = 0  # our threads' CPU time sent so far
        self._comm_cpu_sent = 0  # of it, the poller's

    def ready(self, st):
        """Whether a finished step's times are known."""
        if st.cuda:
            return st.end.query()
        # On CPU a step is ready when its collectives completed, or two steps on.
        return not st.comm or self.prof.step_number - st.number > 2 or all(c[1] is not None for c in st.comm)

    def send_release(self, st, wait):
        """Builds and sends a step's record, then releases its marks."""
        try:
            self.send(st, wait)
        except Exception:
            self.prof.failed()
        self.release(st)

    def release(self, st):
        """Returns a sent step's CUDA events to the profiler's pool."""
        if not st.cuda:
            return
        marks = [st.t0] if st.end_shared else [st.t0, st.end]
        for iv in st.fwd + st.bwd + st.loss + st.optim + st.comm + st.blocked + st.pp_wait:
            marks.extend(iv)
        self.prof.recycle(ev for ev in marks if isinstance(ev, torch.cuda.Event))

    def own_cpu(self):
        """CPU time of our threads since the last record, and of it the
        communication component's poller (read through its thread's CPU
        clock where the platform has one); the rest is the sender's."""
        prof = self.prof
        base = prof.sender_cpu_base()
        if base is None:
            return None, None  # (a record sent from elsewhere: no thread clock to difference)
        comm = prof.comm.cpu_ns()
        total = time.thread_time_ns() + base + comm
        d, self._cpu_sent = total - self._cpu_sent, total
        dc, self._comm_cpu_sent = comm - self._comm_cpu_sent, comm
        return max(d, 0), min(max(dc, 0), max(d, 0))

    def send(self, st, wait):
        """Turns a finished step's marks into a record and sends it."""
        if st.cuda:
            base = st.t0

            def ns(ev):
                if ev is None:
                    return None
                if not ev.query():
                    if not wait:
                        return None  # a collective still running on its stream
                    ev.synchronize()  # only at close
                return int(base.elapsed_time(ev) * 1e6) - st.gap
        else:
            base = st.t0 + st.gap

            def ns(t):
                return None if t is None else t - base
        dur = ns(st.end)
        if dur is None or dur <= 0:
            return

        if st.cuda:
            def ivs(pairs):
                out = []
                for a, b in pairs:
                    a, b = ns(a), ns(b)
                    if a is not None and b is not None:
                        out.append((a, b))
                return out
        else:
            def ivs(pairs):  # host ns: no call a mark (a collective not ended yet has None)
                return [(a - base, b - base) for a, b in pairs if a is not None and b is not None]

        # the marks as ns from the step's start; the rest is the core's (_steps)
        # the collector's pauses: on CPU host marks of the steps' clock,
        # taken out of the phases they fell in; on a GPU their host time
        pauses = [] if st.cuda or not st.gc else clip([(a - base, b - base) for a, b in st.gc], 0, dur)
        data, host = st.data_wait, 0
        if st.pre is not None:
            a, b = ns(st.pre[0]), ns(st.pre[1])
            if a is not None and b is not None:
                paused = length(intersect([(a, b)], pauses))
                pre = max(b - a - st.gap - paused, 0)
                own = 0
                if st.pre_cpu is not None:
                    # the thread's CPU time in it is host work (Python after
                    # the optimizer step, a batch built on this thread); the
                    # rest, the time it did not run, is the data wait, less
                    # our own hooks' time there
                    host = min(max(st.pre_cpu - paused, 0), pre)
                    own = st.pre_own or 0
                data += max(pre - host - own, 0)
        data = min(data, dur)
        host = min(host, dur - data)
        ph = phases(dur, data, ivs(st.fwd), ivs(st.bwd), ivs(st.loss), ivs(st.optim),
                    comm=ivs(st.comm), blocked=ivs(st.blocked), pp_wait=ivs(st.pp_wait), gc=pauses)
        gc_ns = ph.pop("gc", 0) if not st.cuda else min(sum(b - a for a, b in st.gc or ()), dur)
        tokens, padded, samples, seq_sq, fp = self.prof.batch_of(st)
        loss = mean_loss(st.losses)  # (on a GPU, read by fetch_losses)
        self.prof.client.send_step(st.number, st.wall0 + st.gap, dur, tokens, ph,
                                   samples=None if st.skipped else (samples or None), loss=loss,
                                   skipped=st.skipped,
                                   padded_tokens=padded if padded > tokens else None, seq_sq_sum=seq_sq,
                                   bytes=st.bytes or None, rollout=st.rollout, batch_fp=fp,
                                   measures=self.measures(st, gc_ns, host))

    def measures(self, st, gc_ns, host):
        """The step's measures past its phases, by tps.Measures key."""
        cpu, comm_cpu = self.own_cpu()
        out = {"capture_ns": st.own, "capture_cpu_ns": cpu, "capture_comm_ns": st.own_comm,
               "capture_comm_cpu_ns": comm_cpu, "gc_ns": gc_ns, "host_ns": host}
        if st.mem:
            out.update(zip(("mem_peak_allocated_bytes", "mem_peak_reserved_bytes", "mem_capacity_bytes"), st.mem))
        return out

    def fetch_losses(self, steps):
        """(The steps' ends reached.) The losses of steps about to be sent,
        made host values: those on a GPU in one copy, on a stream of this
        thread's own. float() of each would copy on the default stream,
        behind the training's next steps, and spin until the GPU got there
        (60 ms of CPU a step on an H100 with 148 ms steps). The losses were
        computed before their steps' end events, which have completed."""
        prof = self.prof
        if not prof.cuda:
            return
        vals = [v for st in steps for v in st.losses if getattr(v, "is_cuda", False)]
        if not vals:
            return
        try:
            if self._loss_stream is None:
                self._loss_stream = torch.cuda.Stream(prof.device)
            with torch.cuda.stream(self._loss_stream):
                host = torch.stack([v.reshape(()).float() for v in vals]).to("cpu", non_blocking=True)
            self._loss_stream.synchronize()
            got = iter(host.tolist())
            for st in steps:
                if st.losses:
                    st.losses = [next(got) if getattr(v, "is_cuda", False) else v for v in st.losses]
        except Exception:
            prof.failed()

