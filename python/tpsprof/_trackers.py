"""tpsprof's per-step figures where the job already logs: the Weights &
Biases run, TensorBoard ``SummaryWriter`` or MLflow run the training process
has active (docs/trackers.md).

Nothing here runs on the training thread but one small step inside the
job's own ``wandb.log`` call. The sender thread hands each step record it
sent to :meth:`Trackers.add` (a dict of a few floats appended to a bounded
queue); a thread of this module, started only once a tracker is found,
writes the queued figures to the trackers every ``interval`` seconds.
Trackers are looked up by name in ``sys.modules``, never imported: a
process that imports none of them pays one dictionary lookup a second.
A tracker that raises is counted and, after three failures in a row, left
alone; nothing raises into the job.

Names: ``tpsprof/tokens_per_s``, ``tpsprof/step_time_s`` and the step's
shares of ``tpsprof/share/{compute,exposed_comm,data_stall,bubble,
checkpoint,host_other}`` (adding up to 1; on one rank, time blocked in a
collective waiting for slower peers is part of exposed communication, and
host/other is the thread's own work before the forward), the splits
tps.Measures declares (``tpsprof/split/gc``: Python's garbage collector, a
part of compute; ``tpsprof/split/host``: that work before the forward),
plus
``tpsprof/mem_peak_allocated_gib`` on CUDA ranks, at the job's step
numbers. On rank 0, the cluster figures the collector publishes every few
seconds (through the node's agent): ``tpsprof/cluster/tokens_per_s``,
``mfu``, ``hfu``, ``mfu_lost/<bucket>`` (the MFU ledger's points),
``share/<part>`` (waiting for slower peers apart from
exposed communication) over the last ``window_steps`` closed steps,
``straggler_episodes_open`` and ``stragglers``, at the cluster step they
stand at. W&B's own step counter belongs to the job, so tpsprof's rows ride
on the job's own ``wandb.log`` calls, one queued row (oldest first) per
call that commits, against the x-axis ``tpsprof/step``.
"""

import collections
import os
import sys
import threading
import time

from ._measures import MEASURES, SPLITS

__all__ = ["Trackers", "figures", "from_env"]

PREFIX = "tpsprof/"
MAX_ROWS = 4096  # rows held for the trackers; the oldest go past this (counted)
WANDB_LAG = 64  # rows waiting for the job's wandb.log calls past which only the newest goes in
_TB_MODULES = ("torch.utils.tensorboard.writer", "tensorboardX.writer")


def figures(rec):
    """The tracker row of one step record (as the client sent it): its step
    and the figures by name, or None for a record without a duration."""
    dur = rec.get("duration_ns") or 0
    if dur <= 0:
        return None
    s = dur / 1e9
    blocked = {
        "exposed_comm": rec.get("exposed_comm_ns", 0),
        "data_stall": rec.get("data_wait_ns", 0),
        "bubble": rec.get("pp_wait_ns", 0),
        "checkpoint": rec.get("ckpt_ns", 0),
    }
    for name, (part, _label, _key) in SPLITS.items():
        if MEASURES.get(name, ("",))[0] == "blocking":
            # a blocking measure that splits a part (host_ns: the thread's
            # work before the forward, out of the data wait) is that part's
            # time at a rank: host/other's, outside compute
            blocked[part] = blocked.get(part, 0) + rec.get(name, 0)
    total = sum(blocked.values())
    scale = dur / total if total > dur else 1.0  # blocking parts never above the step
    row = {PREFIX + "step_time_s": s}
    if rec.get("tokens", 0) > 0:
        row[PREFIX + "tokens_per_s"] = rec["tokens"] / s
    row[PREFIX + "share/compute"] = max(dur - total * scale, 0) / dur
    for k, v in blocked.items():
        row[PREFIX + "share/" + k] = v * scale / dur
    for name, (_part, _label, key) in SPLITS.items():  # (split/gc: Python's collector, a split of compute, outside share/*, which add up to 1)
        if rec.get(name, 0) > 0:
            row[PREFIX + key] = min(rec[name], dur) / dur
    mem = rec.get("mem_peak_allocated_bytes")
    if mem:
        row[PREFIX + "mem_peak_allocated_gib"] = mem / 2**30
    return int(rec["step"]), row


def _is_cluster(fig):
    """Whether a row is the cluster's figures (tpsprof/cluster/*)."""
    return any(k.startswith(PREFIX + "cluster/") for k in fig)


def _before_close():
    """The job is closing a tracker (SummaryWriter.close, mlflow.end_run,
    wandb.finish, its run's finish): the active profiler's last steps are
    sent and their rows written into it first, at most 2 s (a job that
    closed its writer at the end lost its last rows, or got them through a
    second, never-closed event file). Never raises."""
    try:
        from . import _active
        prof = _active.profiler
        flush = getattr(prof, "flush_for_trackers", None)
        if flush is not None:
            flush(2.0)
    except Exception:
        pass


def _writer_closed(w):
    """(A SummaryWriter's close, the job's thread, after _before_close.) The
    writer is closed: rows that come later (the cluster's figures after the
    job's last step) are not written into it, which would have reopened it
    as a second event file (CI: 2 files in a Lightning run's folder). Marked
    under the trackers' drain lock, so that no drain in progress writes
    into it past this point. Never raises."""
    try:
        from . import _active
        client = getattr(_active.profiler, "client", None)
        tr = getattr(client, "trackers", None)
        lock = getattr(tr, "_drain_lock", None)
        got = lock.acquire(timeout=2.0) if lock is not None else False
        try:
            w._tpsprof_closed = True
        finally:
            if got:
                lock.release()
    except Exception:
        pass


def _wrap_close(owner, name, closing=None):
    """owner.name (a method of a class, or a module's function) calls
    _before_close first, then closing(self) where given (a method's); once."""
    inner = getattr(owner, name, None)
    if inner is None or getattr(inner, "_tpsprof", False):
        return

    def close(*args, **kwargs):
        _before_close()
        if closing is not None and args:
            closing(args[0])
        return inner(*args, **kwargs)

    close._tpsprof = True
    close.__wrapped__ = inner
    close.__doc__ = getattr(inner, "__doc__", None)
    setattr(owner, name, close)


def from_env(rank):
    """The trackers of this process, or None where TPSPROF_TRACKERS=0."""
    if os.environ.get("TPSPROF_TRACKERS", "1").strip().lower() in ("0", "off", "false", "no"):
        return None
    return Trackers(rank, tensorboard_dir=os.environ.get("TPSPROF_TENSORBOARD") or None)


class Trackers:
    """Collects step rows (on the sender thread) and writes them to the
    trackers the process has active (on a thread of its own)."""

    def __init__(self, rank=0, tensorboard_dir=None, interval=1.0):
        self.rank = rank
        self.interval = interval
        self.tensorboard_dir = tensorboard_dir
        self._rows = collections.deque()
        self._cluster_row = None  # the latest cluster figures for the thread's trackers: (step, row)
        self._drain_lock = threading.Lock()  # the thread's drains and a closing tracker's (drain_now)
        # added to rows' steps: the HF Trainer numbers a step by its
        # global_step after the update (tpsprof's step n is its n + 1)
        self.step_offset = 0
        self._raw = collections.deque(maxlen=MAX_ROWS)  # records while no tracker is known
        self._active = False  # a tracker was found: rows are computed as records come
        self.dropped = 0  # rows lost to a full queue
        self.thinned = 0  # W&B rows left out for a job that logs less often than once a step
        self.errors = {}  # tracker -> calls that raised
        self._gone = set()  # trackers left alone after failing
        self._next_look = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._closed = False
        # W&B: rows waiting for the job's next wandb.log call (oldest first)
        self._wandb_run = None
        self._wandb_inner = None
        self._wandb_explicit = False  # the job passes step= to wandb.log
        self._wandb_rows = collections.deque()
        # TensorBoard: the writers the job uses, our own for tensorboard_dir
        self._tb_patched = set()
        self._tb_writers = []  # weak references
        self._tb_backlog = collections.deque()  # rows while no writer is known
        self._tb_own = None
        self._mlflow = None  # (client, run id)

    # -- the sender thread ------------------------------------------------
    def add(self, rec):
        """Queues the figures of one sent step record. Until a tracker is
        found, the record itself is kept (the last MAX_ROWS), its figures
        computed only once one is: a process that logs to no tracker pays
        an append."""
        try:
            if self._active:
                got = figures(rec)
                if got is None:
                    return
                self._queue((got[0] + self.step_offset, got[1]))
            else:
                self._raw.append(rec)
            now = time.monotonic()
            if now >= self._next_look:
                self._next_look = now + self.interval
                self._look()
        except Exception:
            pass

    def _activate(self):
        """A tracker was found: the records kept so far become rows."""
        if self._active:
            return
        raw, self._raw = self._raw, collections.deque(maxlen=MAX_ROWS)
        for rec in raw:
            got = figures(rec)
            if got is not None:
                self._rows.append((got[0] + self.step_offset, got[1]))
        self._active = True

    def _look(self):
        """Finds trackers that appeared (a lookup by name each second)."""
        mods = sys.modules
        w = mods.get("wandb")
        run = getattr(w, "run", None) if w is not None else None
        if run is not None and run is not self._wandb_run and "wandb" not in self._gone:
            try:
                self._activate()
                self._wandb_attach(w, run)
                for r in list(self._rows):  # the rows the thread has not taken yet
                    self._wandb_queue(r)
            except Exception:
                self._gone.add("wandb")
        for name in _TB_MODULES:
            mod = mods.get(name)
            cls = getattr(mod, "SummaryWriter", None) if mod is not None else None
            if cls is not None and name not in self._tb_patched:
                self._tb_patched.add(name)
                self._tb_watch(cls)
        if "mlflow" in mods:
            # the run ends with the job's last rows in it
            _wrap_close(mods["mlflow"], "end_run")
            fluent = mods.get("mlflow.tracking.fluent")
            if fluent is not None:
                _wrap_close(fluent, "end_run")  # (what `with mlflow.start_run()` calls)
        if self._thread is None and (self.tensorboard_dir or self._tb_patched or "mlflow" in mods):
            self._activate()
            self._start()
        elif self._thread is None:
            self._rows.clear()  # W&B's alone: no thread takes them

    def _queue(self, got):
        """A row for the trackers found: the thread's (TensorBoard, MLflow)
        when it runs, W&B's when a run is attached."""
        if self._thread is not None:
            self._push(self._rows, got)
        if self._wandb_run is not None:
            self._wandb_queue(got)

    def _wandb_queue(self, row):
        self._push(self._wandb_rows, row)

    def _push(self, q, row):
        """Appends row to q, the oldest going past MAX_ROWS (counted)."""
        if len(q) >= MAX_ROWS:
            q.popleft()
            self.dropped += 1
        q.append(row)

    def _start(self):
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="tpsprof-trackers", daemon=True)
                self._thread.start()

    def cluster(self, msg):
        """(Sender thread, rank 0.) The job's cluster figures the collector
        published (through the agent): tpsprof/cluster/* at the cluster
        step they stand at."""
        try:
            if self.rank != 0 or not self._active:
                return
            # the cluster step is the ranks' step: at the job's numbering as
            # the rank rows are (the HF Trainer's global_step is one more;
            # a row at step 0 came before its first logged step)
            step = int(msg["step"]) + self.step_offset
            row = {}
            for k in ("tps", "mfu", "hfu"):
                v = msg.get(k)
                if isinstance(v, (int, float)):
                    row[PREFIX + "cluster/" + ("tokens_per_s" if k == "tps" else k)] = float(v)
            for k, v in (msg.get("shares") or {}).items():
                if isinstance(v, (int, float)):
                    row[PREFIX + "cluster/share/" + str(k)[:40]] = float(v)
            for k, v in (msg.get("mfu_lost") or {}).items():  # the MFU ledger: points lost by bucket
                if isinstance(v, (int, float)):
                    row[PREFIX + "cluster/mfu_lost/" + str(k)[:40]] = float(v)
            if msg.get("mfu_counted") is True:
                row[PREFIX + "cluster/mfu_counted"] = 1.0  # MFU from the FLOPs PyTorch counted
            for k in ("window_steps", "straggler_episodes_open", "stragglers"):
                v = msg.get(k)
                if isinstance(v, int):
                    row[PREFIX + "cluster/" + k] = v
            if not row:
                return
            # the latest only, apart from the rank's rows: cluster figures
            # (forged ones at 20,000/s) never evict the job's own rows
            self._cluster_row = (step, row)
            if self._wandb_run is not None:
                # W&B's queue holds one cluster row at most (the latest, at its step)
                q = self._wandb_rows
                for i in range(len(q) - 1, -1, -1):
                    if _is_cluster(q[i][1]):
                        del q[i]
                        break
                self._wandb_queue((step, row))
        except Exception:
            pass

    def _explicit_steps(self):
        """(The job's wandb.log.) The job passes step= to wandb.log."""
        self._wandb_explicit = True

    # -- the trackers' thread ---------------------------------------------
    def _run(self):
        while not self._stop.wait(self.interval):
            self._drain()
        self._drain()

    def drain_now(self):
        """(The job's thread, a tracker closing.) Writes the rows queued so
        far now, W&B's as rows of their own."""
        if not self._active:
            return
        self._drain()
        self._wandb_close()

    def _drain(self):
        with self._drain_lock:
            self._drain_locked()

    def _drain_locked(self):
        rows = []
        while self._rows:
            rows.append(self._rows.popleft())
        c, self._cluster_row = self._cluster_row, None
        if c is not None and self._thread is not None:
            rows.append(c)
        self._call("tensorboard", self._tensorboard, rows)
        self._call("mlflow", self._mlflow_log, rows)

    def _call(self, name, fn, rows):
        if name in self._gone:
            return
        try:
            fn(rows)
            self.errors.pop(name, None)
        except Exception:
            n = self.errors.get(name, 0) + 1
            self.errors[name] = n
            if n >= 3:
                self._gone.add(name)

    # W&B --------------------------------------------------------------------
    def _wandb_attach(self, w, run):
        """Puts tpsprof's rows on the run's log calls: the job's step
        counter stays the job's (a row logged with a step of its own would
        move it, or be dropped behind it)."""
        run.define_metric(PREFIX + "step")
        run.define_metric(PREFIX + "*", step_metric=PREFIX + "step")
        inner = run.log
        rows = self._wandb_rows
        me = self

        def log(data=None, step=None, commit=None, *args, **kwargs):
            if step is not None:
                me._explicit_steps()
            if commit is not False and rows and isinstance(data, dict):
                try:
                    if len(rows) > WANDB_LAG:
                        # the job logs less often than tpsprof has rows: the
                        # newest goes in, the older ones are dropped (counted)
                        n, fig = rows.pop()
                        me.thinned += len(rows)
                        rows.clear()
                    else:
                        n, fig = rows.popleft()
                    data = dict(data)
                    for k, v in fig.items():
                        data.setdefault(k, v)
                    data.setdefault(PREFIX + "step", n)
                except Exception:
                    pass
            return inner(data, step, commit, *args, **kwargs)

        log._tpsprof = True
        log.__wrapped__ = inner
        run.log = log
        _wrap_close(run, "finish")  # the job's last rows go in before the run ends
        _wrap_close(w, "finish")
        if getattr(w, "log", None) == inner:  # wandb.log: the run's bound method
            w.log = log
        self._wandb_inner = inner
        self._wandb_run = run

    def _wandb_close(self):
        """The rows the job's log calls did not carry, at close: committed
        as rows of their own where the job lets W&B count its steps (rows
        with an explicit step would land behind the job's next one)."""
        w = sys.modules.get("wandb")
        run = self._wandb_run
        if run is None or w is None or getattr(w, "run", None) is not run or self._wandb_explicit:
            return
        while self._wandb_rows:
            n, fig = self._wandb_rows.popleft()
            row = dict(fig)
            row[PREFIX + "step"] = n
            self._wandb_inner(row)

    # TensorBoard -------------------------------------------------------------
    def _tensorboard(self, rows):
        writers = []
        for ref in list(self._tb_writers):
            w = ref()
            if w is None:
                self._tb_writers.remove(ref)
            elif not getattr(w, "_tpsprof_closed", False):  # (closed by the job: left alone)
                writers.append(w)
        if self.tensorboard_dir and self._tb_own is None:
            from torch.utils.tensorboard import SummaryWriter  # what --tensorboard asks for
            from ._client import writable_folder
            try:
                folder = writable_folder(self.tensorboard_dir, "rank%d" % self.rank)
            except (OSError, ValueError) as e:
                self.tensorboard_dir = None  # refused once, said once
                sys.stderr.write("tpsprof: --tensorboard: %s\n" % (e,))
                folder = None
            if folder is not None:
                self._tb_own = SummaryWriter(log_dir=folder)
                # ours, never taken for one of the job's by the class watch
                # (every row went twice: 2,897 points for 1,500 steps)
                self._tb_own._tpsprof_seen = True
        if self._tb_own is not None:
            writers.append(self._tb_own)
        if not writers:
            if self._tb_patched:  # the job has a writer class: its first add_scalar will say which
                for r in rows:
                    self._push(self._tb_backlog, r)
            return
        if self._tb_backlog:
            rows = list(self._tb_backlog) + rows
            self._tb_backlog.clear()
        if not rows:
            return
        for w in writers:
            add = getattr(w, "_tpsprof_add_scalar", None) or w.add_scalar
            for n, fig in rows:
                for k, v in fig.items():
                    add(k, v, global_step=n)
            if w is self._tb_own:
                w.flush()

    def _tb_watch(self, cls):
        """A writer the job uses is found at its add_scalar calls (those
        made before tpsprof looked included: the method is the class's)."""
        import weakref
        _wrap_close(cls, "close", _writer_closed)  # the job's last rows go in before it closes
        inner = cls.add_scalar
        if getattr(inner, "_tpsprof", False):
            return
        known = self._tb_writers

        def add_scalar(self_w, *args, **kwargs):
            if getattr(self_w, "_tpsprof_closed", False):
                self_w._tpsprof_closed = False  # the job writes to it again: so may we
            if not getattr(self_w, "_tpsprof_seen", False):
                try:
                    self_w._tpsprof_seen = True
                    self_w._tpsprof_add_scalar = inner.__get__(self_w)
                    known.append(weakref.ref(self_w))
                except Exception:
                    pass
            return inner(self_w, *args, **kwargs)

        add_scalar._tpsprof = True
        add_scalar.__wrapped__ = inner
        cls.add_scalar = add_scalar

    # MLflow -------------------------------------------------------------------
    def _mlflow_run(self):
        """The run id the job has active: MLFLOW_RUN_ID, else the run an
        mlflow.start_run() of any thread made (MLflow keeps it per thread)."""
        mlflow = sys.modules.get("mlflow")
        if mlflow is None:
            return None
        if os.environ.get("MLFLOW_RUN_ID"):
            return os.environ["MLFLOW_RUN_ID"]
        run = None
        try:
            stack = mlflow.tracking.fluent._active_run_stack
            values = stack.get_all_thread_values() if hasattr(stack, "get_all_thread_values") else {}
            for runs in values.values():
                if runs:
                    run = runs[-1]
        except Exception:
            run = None
        if run is None:
            run = mlflow.active_run()
        if run is None:
            return None
        return run.info.run_id

    def _mlflow_log(self, rows):
        run_id = self._mlflow_run()
        if run_id is None:
            return
        if self._mlflow is None or self._mlflow[1] != run_id:
            mlflow = sys.modules["mlflow"]
            self._mlflow = (mlflow.tracking.MlflowClient(), run_id)
        if not rows:
            return
        from mlflow.entities import Metric
        client, run_id = self._mlflow
        ts = int(time.time() * 1000)
        metrics = [Metric(k, float(v), ts, n) for n, fig in rows for k, v in fig.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            client.log_batch(run_id, metrics=metrics[i:i + 1000], synchronous=True)

    # -- close ------------------------------------------------------------------
    def close(self, timeout=5.0):
        """Writes what is queued (at most timeout seconds) and stops."""
        with self._lock:
            self._closed = True
            t = self._thread
        try:
            self._wandb_close()
        except Exception:
            pass
        if t is None:
            return
        self._stop.set()
        t.join(timeout)
        own = self._tb_own
        if own is not None:
            try:
                own.close()
            except Exception:
                pass
