"""Python's garbage collector on the training thread: the pauses of each
step (the record's ``gc_ns``, tps.Measures).

A GC pause on one rank makes every other rank wait at the next collective
(torchtitan tags the steps a collection ran in for that reason). The
collector's runs are timed through ``gc.callbacks``, on the thread that
trains only: a run another thread triggers (the sender's, a loader
thread's) pauses that thread, not the step. The callback keeps two host
timestamps a run; the thread takes the step's pauses when the step ends
(no lock: the callback and the take run on the same thread).

Torch-free, as ``_steps`` is: tested by itself (python/tests/test_gc.py).
"""

import gc
import threading
import time

__all__ = ["GCPauses"]

MAX_PAUSES = 256  # pauses held between two takes; past it they are counted, not kept


class GCPauses:
    """The collector's pauses on one thread, as (start, end) pairs of
    ``time.perf_counter_ns`` (the clock of the CPU path's marks)."""

    def __init__(self, thread=None, clock=time.perf_counter_ns):
        self.thread = thread if thread is not None else threading.get_ident()
        self.clock = clock
        self.dropped = 0  # pauses past MAX_PAUSES between two takes
        self.errors = 0
        self._pauses = []
        self._t0 = None
        self._on = False

    def install(self):
        """Starts timing (idempotent)."""
        if not self._on:
            gc.callbacks.append(self._callback)
            self._on = True

    def remove(self):
        """Stops timing (idempotent)."""
        self._on = False
        try:
            gc.callbacks.remove(self._callback)
        except ValueError:
            pass

    def _callback(self, phase, info):
        try:
            if threading.get_ident() != self.thread:
                return
            t = self.clock()
            if phase == "start":
                self._t0 = t
            elif self._t0 is not None:
                if len(self._pauses) < MAX_PAUSES:
                    self._pauses.append((self._t0, t))
                else:
                    self.dropped += 1
                self._t0 = None
        except Exception:  # never into the collector (nor the job)
            self.errors += 1

    def take(self):
        """(On the thread.) The pauses that ended since the last take."""
        pauses, self._pauses = self._pauses, []
        return pauses
