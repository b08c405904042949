"""The threads tpsprof.torch runs beside training: the sender, which builds
and sends step records off the training thread, and the poller, which notes
when asynchronous collectives complete (on CPU). Neither imports torch: they
work on the core's Step (tpsprof._steps) and on what the profiler hands them.
"""

import collections
import threading
import time
from typing import Any, Callable, List, Tuple, Union

from ._steps import Step

__all__ = ["Sender", "Poller", "settle", "MAX_PENDING"]

MAX_PENDING = 64  # finished steps held while their times are unknown; the oldest go past this
BATCH = 16  # finished steps a drain waits for ...
MAX_WAIT = 0.25  # ... at most this many seconds after the last drain
# A drain gives the GIL back between records once it has held it this long
# (ns): at every record it nearly doubled the sender's CPU a record (the
# hand-off, and the next record built cold: 154-157 us against 81-87 with
# none, 105-107 with this, 93-97 with 2 ms, in BenchmarkTorchStepOverhead's
# near-empty step, torch 1.13); 1 ms bounds the training thread's wait for
# it well under the interpreter's own 5 ms switch interval
HOLD_NS = 1_000_000


class Sender:
    """Runs what touches the agent connection (building and sending step
    records, events, metadata, trace notes) on a thread of its own, in the
    order the training thread asked for it, in batches: the training thread
    appends to a queue (no lock, no wake-up) and the thread looks at it
    every ``interval`` seconds, so a step costs the training thread a
    queue append, not the record's arithmetic, JSON and socket write, nor a
    thread switch per step. Finished steps wait here until their times are
    known (CUDA events done, collectives ended), sent oldest first.

    The thread drains the queue once ``batch`` finished steps wait in it,
    ``max_wait`` seconds after its last drain, or at once when something
    else was queued (an event, metadata, a trace note) or ``settled()``
    asks. The first record of a drain costs this thread 3-4× the next ones
    (the interpreter's and the records' state gone cold in the training's
    time between drains): in a batch that cost is paid once for 16 records,
    not every 3-4 (docs/capture.md, "Overhead")."""

    def __init__(self, prof, interval=0.05, batch=BATCH, max_wait=MAX_WAIT):
        self._prof = prof
        self.interval = interval
        self.batch = batch
        self.max_wait = max_wait
        self._urgent = False  # drain at the next look (something other than a step queued, settled())
        self._items = collections.deque()
        self._stop = threading.Event()
        # set by settled() and close() (never by put: a step costs no
        # wake-up): the thread looks at once instead of at its next interval
        self._wake = threading.Event()
        # notified at the end of each look (rounds counted under it):
        # settled() waits on it, not in a sleep loop
        self._looked = threading.Condition(threading.Lock())
        self._draining = False  # a drain is under way (its steps off the queue, not yet sent)
        self._lock = threading.Lock()  # starts the thread once
        self._thread = None
        self._done = False  # the thread has ended
        self._close_client = False  # the connection is the thread's to close when it ends
        self._steps = collections.deque()  # finished steps not sent yet (this thread's)
        self.cpu_ns = 0  # CPU time this thread spent building and sending (what it costs the process)
        # (on this thread) its CPU clock when it started: a thread's clock may
        # not start at zero (threads reuse kernel threads on some platforms)
        self.cpu_base = 0
        self.rounds = 0  # drains done (settled() waits for one)
        # close's deadline (time.monotonic()), and whether close gave up on
        # the thread: it then sends nothing more and ends (see close)
        self._deadline = None
        self._abandon = False

    def put(self, fn: Union[Step, Callable[[], Any]]) -> None:
        self._items.append(fn)  # atomic; the thread picks it up
        if fn.__class__ is not Step:
            self._urgent = True
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="tpsprof-send", daemon=True)
                    self._thread.start()

    def _drain(self, final=False):
        if not self._items and not self._steps:
            return
        prof = self._prof
        client = prof.client
        t0 = time.thread_time_ns()
        self._draining = True
        client.batch()
        try:
            steps = self._steps
            while self._items:
                fn = self._items.popleft()
                if fn.__class__ is Step:
                    steps.append(fn)
                    continue
                try:
                    fn()
                except Exception:
                    prof._err()
            if final and not prof.cuda:
                # at close: give the poller a moment to see the last
                # collectives end (at most 1 s, and not past close's timeout)
                deadline = time.monotonic() + 1.0
                if self._deadline is not None:
                    deadline = min(deadline, self._deadline)
                while time.monotonic() < deadline and any(c[1] is None for st in steps for c in st.comm):
                    time.sleep(0.001)
            n = 0  # the finished steps whose times are known, oldest first
            for st in steps:
                try:
                    ready = final or prof.records.ready(st)
                except Exception:  # marks of two kinds (the device became known mid-step): drop it
                    ready = True
                    prof._err()
                if not ready:
                    break
                n += 1
            if self._abandon:
                n = 0  # close gave up on this thread: nothing more is sent (below)
            if n:
                batch = [steps.popleft() for _ in range(n)]
                prof.records.fetch_losses(batch)  # their losses on a GPU, in one copy
                prof.batches.count(batch)  # their host batches' tokens, counted together
                held = time.perf_counter_ns()
                for st in batch:
                    if time.perf_counter_ns() - held > HOLD_NS:
                        # the GIL back to the training thread, if it waits
                        # for it: a drain of 16 held it for up to Python's
                        # 5 ms switch interval on a loaded host, delaying the
                        # training thread at a collective by that
                        time.sleep(0)
                        held = time.perf_counter_ns()
                    prof.records.send_release(st, final)
            if self._abandon:
                while steps:
                    prof.records.release(steps.popleft())
                    prof.pending_dropped += 1
            while len(steps) > MAX_PENDING:  # times never known (a GPU far behind): the oldest go
                prof.records.release(steps.popleft())
                prof.pending_dropped += 1
        finally:
            client.unbatch()
            self._draining = False
            self.cpu_ns += time.thread_time_ns() - t0

    def unsent(self) -> int:
        """Finished steps not sent yet."""
        return len(self._steps) + sum(1 for x in list(self._items) if x.__class__ is Step)

    def settled(self, timeout: float) -> None:
        """(Another thread.) Waits, at most timeout seconds, until the steps
        finished so far are sent: none unsent, and a drain ended after that
        was seen (a drain takes its steps off the queue before it sends
        them: a tracker closed at the job's end lost its last 1-2 rows when
        the queue alone was watched). With nothing unsent and no drain
        under way it returns at once; otherwise it wakes the thread and
        waits for the end of its look: a tracker closed every step cost
        the training thread ~87 ms each (two of the thread's 50 ms looks
        waited out in a sleep loop)."""
        t = self._thread
        if t is None or self._done or (not self._draining and not self.unsent()):
            return
        deadline = time.monotonic() + timeout
        with self._looked:
            n = self.rounds
        self._urgent = True
        self._wake.set()
        with self._looked:
            while not self._done and t.is_alive():
                if self.rounds != n and not self.unsent():
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                if self.rounds != n:
                    # looked, and steps are still unsent (their times not
                    # known yet): the thread's next look drains them
                    # (urgent), not a wake-up at once (no busy loop)
                    n = self.rounds
                    self._urgent = True
                self._looked.wait(left)

    def _run(self):
        client = self._prof.client
        self.cpu_base = -time.thread_time_ns()
        last = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            now = time.monotonic()
            if self._urgent or len(self._items) + len(self._steps) >= self.batch or now - last >= self.max_wait:
                self._urgent = False  # (before the drain: a put meanwhile is drained next time)
                self._drain()
                last = now
            client.poll_control()
            with self._looked:
                self.rounds += 1
                self._looked.notify_all()
        self._drain(final=True)
        with self._lock:
            self._done = True
            close = self._close_client
        with self._looked:
            self._looked.notify_all()
        if close:
            client.close(0)

    def close(self, timeout: float = 2.0) -> bool:
        """Runs what is queued (at most timeout seconds), then stops. False
        when the thread is still at work: it closes the connection itself
        once done (two threads writing one stream would mix their lines).

        Past the timeout the thread is given up on: it sends nothing more
        (the steps not sent are dropped, counted in pending_dropped) and
        ends, waited for a moment longer. A thread of ours still building
        records (torch calls among them) when the interpreter exits aborted
        a gloo job there ("terminate called without an active exception",
        every time in the job of test_sender_exit)."""
        self._deadline = time.monotonic() + max(timeout, 0)
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                self._abandon = True
                t.join(0.5)
        with self._lock:
            if t is not None and not self._done:
                self._close_client = True
                return False
        return True


def settle(items: List[Tuple[list, list]], now: int) -> List[Tuple[list, list]]:
    """Ends the cells whose works are complete at now (the earliest
    observation wins); returns the others."""
    left = []
    for cell, works in items:
        if cell[1] is not None:
            continue
        try:
            done = all(w.is_completed() for w in works)
        except Exception:
            done = True
        if done:
            cell[1] = now
        else:
            left.append((cell, works))
    return left


class Poller:
    """Notes when asynchronous collectives complete, on a thread of its own.

    While works are in flight it checks them every ``interval`` seconds,
    or an eighth of the youngest one's age if longer, at most
    ``longest`` (the resolution of their end times on CPU: 0.2 ms, or 12.5%
    of a collective's time in flight, at most 1 ms); otherwise it sleeps.
    A collective long in flight (a pipeline stage's send waiting for the
    next stage) is checked at most 1,000 times a second, not 5,000."""

    def __init__(self, interval=0.0002, longest=0.001):
        self.interval = interval
        self.longest = longest
        self._cv = threading.Condition()
        self._items = []  # in flight, taken by the thread (under _cv)
        # handed over by the training thread without a lock (an append is
        # atomic); the thread is woken only when it sleeps with nothing to
        # check (_idle), not at every collective
        self._new = collections.deque()
        self._idle = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="tpsprof-comm", daemon=True)
        self._thread.start()
        self._clock = None  # the thread's CPU clock, once its id is known

    def cpu_ns(self) -> int:
        """CPU time this thread has used (0 where the platform cannot say)."""
        try:
            if self._clock is None:
                self._clock = time.pthread_getcpuclockid(self._thread.ident)
            return time.clock_gettime_ns(self._clock)
        except (AttributeError, OSError, TypeError):
            return 0

    def watch(self, cell: list, works: list) -> None:
        self._new.append((cell, works))
        if self._idle:  # (set before the thread last looked at _new: no wake-up is lost)
            with self._cv:
                self._cv.notify()

    def watch_all(self, items: list) -> None:
        """watch for each (cell, works), with one wake-up."""
        self._new.extend(items)
        if self._idle:
            with self._cv:
                self._cv.notify()

    def _run(self):
        new = self._new
        while True:
            with self._cv:
                while True:
                    self._idle = True
                    if self._items or new or self._stop:
                        break
                    self._cv.wait()
                self._idle = False
                if self._stop:
                    return
                items = self._items
                self._items = []
                while new:
                    items.append(new.popleft())
            now = time.perf_counter_ns()
            left = settle(items, now)
            if left:
                with self._cv:
                    self._items = left + self._items
                young = max(c[0] for c, _ in left)
                time.sleep(min(max(self.interval, (now - young) * 1.25e-10), self.longest))

    def sweep(self):
        """The training thread's own look at the works in flight, at its
        phase boundaries: on a loaded machine this thread may be scheduled
        (or get the GIL) long after a work completed, and a completion the
        training thread has already seen is not later than now."""
        if not self._items and not self._new:
            return  # nothing in flight (the common case at a phase boundary)
        with self._cv:
            items = list(self._items) + list(self._new)
        if items:
            settle(items, time.perf_counter_ns())

    def stop(self):
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(1.0)
