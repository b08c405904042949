"""What measuring costs the training thread, a component of the in-process
profiler (``prof.cost``): the time in our hooks (the step's ``capture_ns``).

A hook is counted by ``owned``, a wrapper put on the profiler's hook methods
and on its components' marks (tpsprof.torch lists them): the time from its
entry to its return on the host's clock, a hook called inside another
counted once (a per-thread flag: autograd's threads run hooks too). What
PyTorch's slower path for a hooked module costs is not in it: the paired
benchmarks measure that (docs/capture.md, Overhead).

TPSPROF_OWN_DETAIL=1 also splits it by hook (and by the marks and memory
reads inside them) in ``cost.by``: a diagnostic for the cost benchmark
(bench_torch.py), off by default (a dict update a call).
"""

import os
import threading
import time

__all__ = ["Cost", "owned", "DETAIL"]

DETAIL = os.environ.get("TPSPROF_OWN_DETAIL") == "1"


class _InHook(threading.local):
    t0 = 0  # inside a hook whose time is counted: since when (host ns)


class Cost:
    """The training thread's time in the profiler's hooks."""

    def __init__(self):
        self.pending_ns = 0  # since the last step finished
        self.comm_pending_ns = 0  # of it, the communication component's marks
        self.fin_ns = 0  # of the hook that finished the last step, its time after that step's end
        self.total_ns = 0  # the steps' capture_ns, summed (what the profiler says it cost the training thread)
        self.by = {}  # (DETAIL) ns by hook
        self.in_hook = _InHook()

    def step_finished(self):
        """(The hook that finishes a step.) The step's cost, and of it the
        communication component's: what the hooks cost up to now,
        finishing it included; the hook we are in goes on counting for the
        next step."""
        g = self.in_hook
        self.fin_ns = 0
        if g.t0:
            t = time.perf_counter_ns()
            # (the hook we are in began after the step ended: its time so
            # far lies before the next step's forward, ours, not its data wait)
            self.fin_ns = t - g.t0
            self.pending_ns += t - g.t0
            g.t0 = t
        own, self.pending_ns = self.pending_ns, 0
        comm, self.comm_pending_ns = self.comm_pending_ns, 0
        self.total_ns += own
        return own, comm

    def since_step(self):
        """Our hooks' time since the last step ended (the one finishing it,
        a first connection, the sender's start): no one's data wait."""
        g = self.in_hook
        return self.fin_ns + self.pending_ns + (time.perf_counter_ns() - g.t0 if g.t0 else 0)

    def timed(self, name, fn):
        """(DETAIL) fn with its time added to ``by[name]``."""
        now, by = time.perf_counter_ns, self.by

        def timed(*args):
            t = now()
            try:
                return fn(*args)
            finally:
                by[name] = by.get(name, 0) + now() - t
        return timed


def owned(fn, component=False, clock=time.perf_counter_ns):
    """fn, a hook method, with its time counted in its profiler's ``cost``;
    a hook called inside another counts once (in the outer one's
    component). component: fn is a method of one of the profiler's
    components (its ``prof``); only the communication component's are
    wrapped so, and counted apart too (``comm_pending_ns``). clock: the
    host's (a test's own)."""
    now = clock
    detail = DETAIL
    key = fn.__name__
    if component:
        key = fn.__qualname__.split(".")[0].lower() + "." + key  # (by: "comm.issue")

    def hook(self, *args, **kwargs):
        c = (self.prof if component else self).cost
        g = c.in_hook
        if g.t0:
            return fn(self, *args, **kwargs)
        g.t0 = now()
        try:
            return fn(self, *args, **kwargs)
        finally:
            t = now() - g.t0
            c.pending_ns += t
            if component:
                c.comm_pending_ns += t
            if detail:
                c.by[key] = c.by.get(key, 0) + t
            g.t0 = 0
    hook.__name__, hook.__qualname__, hook.__doc__, hook.__wrapped__ = fn.__name__, fn.__qualname__, fn.__doc__, fn
    return hook
