"""The trace capture component of the in-process profiler: one step in
every ``trace_every`` profiled with torch.profiler, and the on-demand
captures ``tpsprof trace`` asks for through the agent; each trace written
to the folder shared with the agent, which analyses it off the training
process (docs/kineto.md).

It reaches the profiler only through its public seam (``off``, ``cuda``,
``client``, ``step_number``, ``failed()``, ``later(fn)``) and owns what
it keeps: the schedule, the capture asked for, the trace being taken, the
folder's check and the failures in a row. The job's own torch.profiler
sessions come first: ours never starts beside one, and stops when one
starts (``watch_job_profilers``).
"""

import os
import sys
import time

import torch

from . import _active, _client
from ._flops import job_profiler_running

__all__ = ["TraceCapture", "watch_job_profilers"]


def watch_job_profilers() -> None:
    """Counts the job's own torch.profiler sessions while they run (from
    start() to stop(): a scheduled profiler from its first waiting step),
    on torch's profile class itself (the sessions are the process's, not a
    profiler's of ours): a capture or a sampled trace of ours never starts
    beside one, and one of the job's starting stops ours first. Once per
    process; never raises."""
    try:
        P = torch.profiler.profile
        if P.__dict__.get("_tpsprof_watched"):
            return
        start, stop = P.start, P.stop

        def watched_start(self, *args, **kwargs):
            if not getattr(self, "_tpsprof_own", False):
                prof = _active.profiler
                if prof is not None:
                    prof.capture.yield_to_job()
            r = start(self, *args, **kwargs)
            if not getattr(self, "_tpsprof_own", False) and not getattr(self, "_tpsprof_counted", False):
                self._tpsprof_counted = True
                P._tpsprof_running = P.__dict__.get("_tpsprof_running", 0) + 1
            return r

        def watched_stop(self, *args, **kwargs):
            try:
                return stop(self, *args, **kwargs)
            finally:
                if getattr(self, "_tpsprof_counted", False):
                    self._tpsprof_counted = False
                    P._tpsprof_running = max(P.__dict__.get("_tpsprof_running", 1) - 1, 0)

        watched_start.__wrapped__, watched_stop.__wrapped__ = start, stop
        P.start, P.stop = watched_start, watched_stop
        P._tpsprof_watched = True
    except Exception:
        pass


def every_env(given):
    """The steps between sampled traces: given, else TPSPROF_TRACE_EVERY,
    else 0 (off)."""
    if given is None:
        try:
            given = int(os.environ.get("TPSPROF_TRACE_EVERY", "0") or 0)
        except ValueError:
            given = 0
    return max(int(given), 0)


class TraceCapture:
    """The profiled steps (a component of TorchProfiler, ``prof.capture``).
    ``every``: steps between sampled traces (0: none); ``dir``: the folder
    shared with the agent; ``traces`` written, ``errors`` that could not
    be (they never switch the profiler off)."""

    def __init__(self, prof, every, trace_dir):
        self.prof = prof
        self.every = every
        self.dir = trace_dir
        self.traces = 0
        self.errors = 0
        self.tracing = None  # (profile, its step's record_function, step, capture id) while a step is traced
        self.request = None  # [id, first step, steps, started]: an on-demand capture (tpsprof trace)
        self._dir_ok = None  # checked once, at the first trace
        self._failures = 0  # writes failed in a row

    def _say(self, capture, n, state, why=""):
        """A capture's state, to the command (off the training thread)."""
        c = self.prof.client
        self.prof.later(lambda: c.capture_state(capture, state, n, why))

    def on_control(self, obj):
        """(Sender thread.) A capture request from the agent: profile steps
        at_step .. at_step+steps-1. The training thread looks at it where
        a step begins (step_begins); nothing else waits on it."""
        if obj.get("type") != "capture":
            return
        try:
            req = [str(obj["id"]), int(obj["at_step"]), max(int(obj["steps"]), 1), False]
        except (KeyError, TypeError, ValueError):
            return
        prof = self.prof
        c = prof.client
        if prof.off:
            c.capture_state(req[0], "failed", prof.step_number or 0, "tpsprof switched itself off in this process")
            return
        self.request = req
        c.capture_state(req[0], "accepted", prof.step_number or 0)

    def step_begins(self):
        """(Training thread.) A step begins: traced when a capture asks for
        it or the schedule samples it (never beside the job's own
        profiler: skipped)."""
        if self.tracing is not None:
            return
        if self.request is not None:
            self._capture_step()
        elif self.every:
            n = self.prof.step_number or 0
            if n % self.every == 0 and not job_profiler_running():
                self._start(n)

    def _capture_step(self):
        """Starts tracing the step when the capture asks for it; says so
        when its first step went by."""
        cap = self.request
        cid, at, steps, started = cap
        n = self.prof.step_number or 0
        if n < at:
            return
        if n > at and not started:
            # (before the end check: a request whose steps all went by
            # while it travelled was dropped unsaid, and the command
            # waited its whole timeout)
            self.request = None
            self._say(cid, n, "failed", "step %d was already past when the request came (this rank is at step %d)" % (at, n))
            return
        if n >= at + steps:
            self.request = None
            return
        if job_profiler_running():
            # torch.profiler sessions are process-wide: a second one beside
            # the job's own crashed the process (torch 2.14) or emptied the
            # job's trace. Busy, said, and not an error of ours.
            self.request = None
            self._say(cid, n, "failed", "busy: the job's own profiler is running")
            return
        cap[3] = True
        self._start(n, cid)
        if n == at + steps - 1:
            self.request = None

    def _start(self, n, capture=None):
        """Profiles step n with torch.profiler (CPU, and CUDA on a GPU)."""
        try:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.prof.cuda else [])
            p = profile(activities=acts)
            p._tpsprof_own = True  # not the job's (watch_job_profilers)
            p.__enter__()
            rf = torch.autograd.profiler.record_function("ProfilerStep#%d" % n)
            rf.__enter__()
            self.tracing = (p, rf, n, capture)
        except Exception as e:
            self.tracing = None
            if capture:
                # a capture refused is said to the command, never counted
                # as an error (13 refused captures switched the package off)
                self._say(capture, n, "failed", "torch.profiler did not start: %s" % (e,))
            else:
                self.prof.failed()

    def yield_to_job(self):
        """The job's own profiler starts while ours traces a step: ours
        stops first, its trace dropped; a capture says so."""
        if self.tracing is None:
            return
        _, _, n, capture = self.tracing
        self._stop()
        if capture:
            self.request = None
            self._say(capture, n, "failed", "busy: the job's own profiler started")

    def discard(self):
        """Drops the trace of a step that was not training's."""
        if self.tracing is not None and not self._stop():
            self.prof.failed()

    def _stop(self):
        """Stops our trace of the step, its trace dropped; False when the
        profiler would not stop."""
        p, rf, _, _ = self.tracing
        self.tracing = None
        try:
            rf.__exit__(None, None, None)
            p.__exit__(None, None, None)
        except Exception:
            return False
        return True

    def end(self):
        """Ends a profiled step, writes its trace for the agent and tells it."""
        p, rf, n, capture = self.tracing
        self.tracing = None
        c = self.prof.client
        path = None
        try:
            rf.__exit__(None, None, None)
            # A collective's work is marked complete (so the step could end)
            # before its worker thread closes the op's profiler record; an
            # op still open when the profiler stops is dropped from the
            # trace (seen with gloo: a traced step without its all-reduce).
            # A few milliseconds, on profiled steps only, let it close.
            time.sleep(0.005)
            p.__exit__(None, None, None)
            if self._dir_ok is None:
                why = _client.private_dir_problem(self.dir)
                self._dir_ok = why is None
                if why is not None:
                    sys.stderr.write("tpsprof: not writing profiler traces: %s\n" % why)
            if not self._dir_ok:
                self.every = 0
                if capture:
                    self._say(capture, n, "failed", "no trace folder shared with the agent")
                return
            path = os.path.join(self.dir, "%s.%d.%d.%d.pt.trace.json" % (c.job, c.attempt, c.rank, n))
            # the folder is ours alone and the name made afresh: the
            # exporter cannot be sent through a planted link
            _client.create_private_file(path)
            p.export_chrome_trace(path)
            # before the step's record, in order: the agent holds the
            # record for the trace's figures
            self.prof.later(lambda: c.trace_ready(n, path, capture))
            self.traces += 1
            self._failures = 0
        except Exception as e:
            # A trace that cannot be written (a full disk) costs the traces,
            # never the step records: after 3 failures in a row tracing
            # stops, said once, and the profiler goes on (it used to count
            # them as errors and switch itself off after 100).
            self.errors += 1
            self._failures += 1
            if path is not None:
                try:
                    os.remove(path)
                except Exception:
                    pass
            if capture:
                self._say(capture, n, "failed", "the trace could not be written: %s" % (e,))
            if self._failures >= 3 and self.every:
                self.every = 0
                sys.stderr.write("tpsprof: profiler traces off after 3 failed writes (%s); steps are still measured\n" % (e,))
