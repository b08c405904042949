"""The plain API (see the package's documentation for an example): time
training steps by hand and send them to the node's agent.

Stdlib only. It never blocks and never raises into the training loop: sends
are non-blocking writes to the agent's unix socket; when the agent is missing,
slow or restarting, records are dropped and counted (``prof.dropped``).

``tokens`` are the tokens this rank's data-parallel replica consumed in the
step (all micro-batches), real tokens, not padding. Ranks of one replica
(tensor/pipeline/context-parallel peers) report the same number; tpsprof
counts it once per replica.

Environment (set by ``tpsprof launch``; torchrun sets RANK, WORLD_SIZE,
LOCAL_RANK, TORCHELASTIC_RESTART_COUNT): TPSPROF_SOCKET, TPSPROF_JOB,
TPSPROF_ATTEMPT, TPSPROF_TOPOLOGY ("dp=4,tp=8,pp=2"), RANK, WORLD_SIZE,
LOCAL_RANK. A rank's rank and world size are the process group's once the
job has made one, else RANK and WORLD_SIZE, else srun's SLURM_PROCID and
SLURM_NTASKS (SLURM_LOCALID for the local rank); the job id defaults to
slurm-$SLURM_JOB_ID under Slurm.

The attempt of a record is TPSPROF_ATTEMPT (the launch's first attempt, which
``tpsprof launch`` chooses so that a new launch never reuses an attempt of the
job) plus TORCHELASTIC_RESTART_COUNT (torchrun's elastic restarts within the
launch) plus SLURM_RESTART_COUNT when no launch set TPSPROF_ATTEMPT: every
restart is its own attempt.
"""

import contextlib
import json
import os
import re
import socket
import sys
import stat
import tempfile
import time
from types import MappingProxyType

from . import _rollout, _trackers
from ._measures import MAX_STEP_NS, MEASURES

__all__ = ["Profiler", "TPSProf", "PHASES", "default_socket", "env_attempt"]

PHASES = ("data_wait", "fwd", "bwd", "optim", "comm", "exposed_comm", "pp_wait", "ckpt")
# a phase's record key and whether it blocks the step (its bound the
# step's duration; the others 24 h), from MEASURES: one lookup a phase
_PHASE_KEYS = MappingProxyType({k: (k + "_ns", MEASURES[k + "_ns"][0] == "blocking") for k in PHASES})


def _bounded(name, v, dur):
    """A measure's value within the bounds tps.Measures gives it
    (_measures.MEASURES), or None to leave it out: not a measure, not
    positive, or one whose bounds only the Go side checks."""
    kind, hi = MEASURES.get(name, (None, None))
    v = int(v)
    if v <= 0 or kind is None:
        return None
    if kind == "blocking":
        return min(v, dur)
    if kind in ("phase", "trace"):
        return min(v, MAX_STEP_NS)
    return v if hi is not None and v <= hi else None


def default_socket():
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "tpsprof.sock")
    return os.path.join(tempfile.gettempdir(), "tpsprof-%d.sock" % os.getuid())


def topology_coords(spec, rank):
    """Coordinates of rank in "dp=..,tp=..,pp=..,cp=.." (Megatron order tp-cp-dp-pp)."""
    sizes = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1}
    for part in spec.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            sizes[k.strip()] = int(v)
    tp, cp, dp = sizes["tp"], sizes["cp"], sizes["dp"]
    r = rank
    c = {"tp_rank": r % tp}
    r //= tp
    c["cp_rank"] = r % cp
    r //= cp
    c["dp_rank"] = r % dp
    c["pp_rank"] = r // dp
    c["ep_rank"] = c["dp_rank"] % sizes["ep"]
    return c


def _int_env(name, default=0):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def slurm_job():
    """The job id under Slurm: slurm-<job id>, an array task's
    slurm-<array job id>_<task id> (None outside Slurm)."""
    env = os.environ
    arr, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if arr and task:
        return "slurm-%s_%s" % (arr, task)
    jid = env.get("SLURM_JOB_ID")
    return "slurm-" + jid if jid else None


def env_attempt():
    """The attempt this process belongs to, from the environment (see above)."""
    restarts = _int_env("TORCHELASTIC_RESTART_COUNT")
    if "TPSPROF_ATTEMPT" in os.environ:
        return max(_int_env("TPSPROF_ATTEMPT"), 0) + max(restarts, 0)
    return max(restarts, 0) + max(_int_env("SLURM_RESTART_COUNT"), 0)


# what the agent accepts (tps.ValidJobID, tps.MaxAttempt): a job name or an
# attempt outside them had every record refused at the agent, the job told
# nothing
_JOB_ID = r"^[A-Za-z0-9_-]{1,64}$"
MAX_ATTEMPT = 1 << 20


def check_identity(job, attempt):
    """Why the agent would refuse every record of this job and attempt
    ("" when it would not)."""
    if not isinstance(job, str) or not re.match(_JOB_ID, job):
        return "the job name %r is not 1-64 characters of [A-Za-z0-9_-] (TPSPROF_JOB, or job=)" % (job,)
    if not 0 <= attempt <= MAX_ATTEMPT:
        return "the attempt %d is outside 0-%d (TPSPROF_ATTEMPT, or attempt=)" % (attempt, MAX_ATTEMPT)
    return ""


class Profiler:
    """Times steps of one rank and sends one JSON line per step to the agent."""

    def __init__(self, job=None, rank=None, world_size=None, local_rank=None, attempt=None,
                 socket_path=None, topology=None, max_pending_bytes=1 << 20, reconnect_interval=1.0):
        env = os.environ
        self.job = job or env.get("TPSPROF_JOB") or slurm_job() or "default"
        # rank and world size: given, else the process group the job makes
        # (read at the first record once it exists: _rank_from_group), else
        # RANK/WORLD_SIZE, else srun's SLURM_PROCID/SLURM_NTASKS (a task a
        # rank: each read rank 0 of world 1, and the collector dropped one's
        # records as duplicates)
        self._rank_given = rank is not None or world_size is not None
        self.rank = int(rank if rank is not None else env.get("RANK", env.get("SLURM_PROCID", 0)))
        self.world_size = int(world_size if world_size is not None else env.get("WORLD_SIZE", env.get("SLURM_NTASKS", 1)))
        lr = local_rank if local_rank is not None else env.get("LOCAL_RANK", env.get("SLURM_LOCALID"))
        self.local_rank = int(lr) if lr is not None else None
        self.attempt = int(attempt) if attempt is not None else env_attempt()
        # the agent's checks, made here: said once on stderr (not raised:
        # the job runs), rather than every record refused unsaid
        self.invalid = check_identity(self.job, self.attempt)
        if self.invalid:
            sys.stderr.write("tpsprof: %s: nothing will be recorded for this job\n" % self.invalid)
        self.path = socket_path or env.get("TPSPROF_SOCKET") or default_socket()
        topo = topology or env.get("TPSPROF_TOPOLOGY")
        self.declared_topology = topo or None
        self._coords = {}
        if topo:
            try:
                self._coords = topology_coords(topo, self.rank)
            except (ValueError, ZeroDivisionError):
                self._coords = {}
        self.max_pending_bytes = max_pending_bytes
        self.reconnect_interval = reconnect_interval
        self.sent = 0
        self.dropped = 0
        self._sock = None
        self._pending = b""
        self._held = None  # lines of a batch (batch()), not yet written
        self._held_bytes = 0
        self._next_try = 0.0
        self._warned = set()  # socket paths said to be another user's (said once)
        self._said_no_agent = False  # "no agent" said (at the first record dropped for want of one)
        self._step = None
        self._t0 = 0
        self._t0_wall = 0
        self._phases = {}
        self._rollout = None
        self.on_control = None  # called with each line the agent writes (a capture request)
        self._ctl = b""
        # the job's W&B, TensorBoard and MLflow runs get each sent step's
        # figures (docs/trackers.md); None with TPSPROF_TRACKERS=0
        self.trackers = _trackers.from_env(self.rank)

    def _rank_from_group(self):
        """The rank and world size of the default process group, once the
        job has made one (then fixed: a record's world size does not change
        within an attempt)."""
        d = sys.modules.get("torch.distributed")
        if d is None:
            return
        try:
            if not (d.is_available() and d.is_initialized()):
                return
            rank, world = d.get_rank(), d.get_world_size()
        except Exception:
            return
        self._rank_given = True
        if (rank, world) != (self.rank, self.world_size):
            self.rank, self.world_size = rank, world
            if self.declared_topology:
                try:
                    self._coords = topology_coords(self.declared_topology, self.rank)
                except (ValueError, ZeroDivisionError):
                    self._coords = {}

    # -- timing -----------------------------------------------------------
    def start(self, step):
        """Marks the start of optimizer step ``step``."""
        self._step = int(step)
        self._phases = {}
        self._rollout = None
        self._t0_wall = time.time_ns()
        self._t0 = time.perf_counter_ns()

    def add_phase(self, name, seconds):
        """Adds ``seconds`` to a phase of the current step (see PHASES)."""
        if name in PHASES and seconds > 0:
            self._phases[name] = self._phases.get(name, 0) + int(seconds * 1e9)

    @contextlib.contextmanager
    def phase(self, name):
        """Times a block as a phase: ``with prof.phase("data_wait"): ...``."""
        t = time.perf_counter_ns()
        try:
            yield
        finally:
            if name in PHASES:
                self._phases[name] = self._phases.get(name, 0) + time.perf_counter_ns() - t

    def rollout(self):
        """Times the step's generation phase (RL rollouts before the
        update) and returns its :class:`Rollout` to record requests on::

            with prof.rollout() as r:
                for prompt in prompts:
                    out, times = generate(prompt)
                    r.request(len(prompt), len(out), token_times=times, start=t0)

        Tokens passed to :meth:`end` are the update's training tokens."""
        def done(r):
            self._rollout = r
        return _rollout.RolloutBlock(done, self._rollout)

    def end(self, tokens, loss=None, flops=None, samples=None, padded_tokens=None, skipped=False, seq_sq_sum=None,
            bytes=None):
        """Closes the current step and sends its record. Never raises.

        ``seq_sq_sum`` is, for packed or variable-length batches, the sum
        over the batch's documents of their length squared: the collector
        then counts attention FLOPs exactly instead of charging every token
        the whole training sequence. ``bytes`` is the UTF-8 length of the
        text behind the tokens: bytes/s compares runs with different
        tokenizers."""
        try:
            if self._step is None:
                return
            dur = max(time.perf_counter_ns() - self._t0, 1)
            step, self._step = self._step, None
            self.send_step(step, self._t0_wall, dur, tokens, self._phases, loss=loss, flops=flops,
                           samples=samples, padded_tokens=padded_tokens, skipped=skipped, seq_sq_sum=seq_sq_sum,
                           bytes=bytes, rollout=self._rollout)
            self._rollout = None
        except Exception:  # never into the training loop
            self.dropped += 1

    def set_coords(self, coords):
        """This rank's coordinates in the job's layout, as the device mesh
        gave them (they win over a declared topology's): sent with every
        record from now on."""
        self._coords = dict(coords)

    def send_step(self, step, start_unix_ns, duration_ns, tokens, phases_ns=None, loss=None, flops=None,
                  samples=None, padded_tokens=None, skipped=False, seq_sq_sum=None, bytes=None, rollout=None,
                  batch_fp=None, measures=None):
        """Sends one step measured elsewhere (tpsprof.torch). Never raises.

        ``phases_ns`` maps phase names (PHASES) to nanoseconds, ``measures``
        other measures by key (``capture_ns``, ``gc_ns``, the memory peaks:
        tps.Measures, _measures.py); each is held to its bounds there:
        those that block the step (data_wait, exposed_comm, pp_wait, ckpt,
        gc) clipped to the step's duration, exposed_comm to comm. ``batch_fp`` is the
        fingerprint of the step's first batch (the first steps only): the
        agent compares its ranks' (identical batches on separate replicas).
        """
        try:
            if not self._rank_given:
                self._rank_from_group()
            dur = max(int(duration_ns), 1)
            rec = {
                "job": self.job, "attempt": self.attempt, "step": int(step),
                "rank": self.rank, "world_size": self.world_size,
                "start_unix_ns": int(start_unix_ns), "end_unix_ns": int(start_unix_ns) + dur,
                "duration_ns": dur, "tokens": max(int(tokens), 0),
            }
            if self.local_rank is not None:
                rec["local_rank"] = self.local_rank
            rec.update(self._coords)
            if phases_ns:
                for k, v in phases_ns.items():
                    got = _PHASE_KEYS.get(k)
                    if got is not None and v:
                        v = int(v)
                        if v > 0:
                            rec[got[0]] = min(v, dur) if got[1] else min(v, MAX_STEP_NS)
                if "exposed_comm_ns" in rec:
                    rec["exposed_comm_ns"] = min(rec["exposed_comm_ns"], rec.get("comm_ns", rec["exposed_comm_ns"]))
            if loss is not None and loss == loss and abs(loss) != float("inf"):
                rec["loss"] = float(loss)
            if flops:
                rec["flops"] = float(flops)
            if samples:
                rec["samples"] = int(samples)
            if padded_tokens:
                rec["padded_tokens"] = int(padded_tokens)
            if seq_sq_sum and int(seq_sq_sum) >= rec["tokens"] > 0:
                rec["seq_sq_sum"] = int(seq_sq_sum)
            if skipped:
                rec["skipped"] = True
            if bytes and int(bytes) > 0:
                rec["bytes"] = int(bytes)
            if batch_fp:
                rec["batch_fp"] = str(batch_fp)[:32]
            for k, v in (measures or {}).items():
                if v and k not in rec:  # (most are 0 or None a step: no lookup)
                    v = _bounded(k, v, dur)
                    if v is not None:
                        rec[k] = v
            if rollout is not None and (rollout.requests or rollout.ns):
                gen = rollout.fields()
                gen["gen_ns"] = min(gen["gen_ns"], dur)
                rec.update({k: v for k, v in gen.items() if v > 0})
            self._send(rec)
            if self.trackers is not None:
                self.trackers.add(rec)
            if rollout is not None and rollout.requests:
                ev = {"type": "event", "job": self.job, "attempt": self.attempt, "kind": "rollout",
                      "rank": self.rank, "step": int(step), "start_unix_ns": int(start_unix_ns),
                      "end_unix_ns": int(start_unix_ns) + dur,
                      "detail": json.dumps(rollout.detail(), separators=(",", ":"))}
                self._send(ev)
        except Exception:  # never into the training loop
            self.dropped += 1

    def meta(self, **fields):
        """Sends run metadata (keys of the intake's meta line, e.g.
        ``topology={"dp": 4, "tp": 2}``). Never raises."""
        try:
            m = {"type": "meta", "job": self.job}
            m.update(fields)
            self._send(m)
        except Exception:
            self.dropped += 1

    def trace_ready(self, step, path, capture=None):
        """Tells the agent a profiler trace of ``step`` is at ``path`` (in
        its trace folder) to analyse and delete; ``capture``: the on-demand
        capture it was taken for. Never raises."""
        try:
            note = {"type": "trace", "job": self.job, "attempt": self.attempt, "rank": self.rank,
                    "step": int(step), "path": str(path)}
            if capture:
                note.update(capture=str(capture), world_size=self.world_size)
                if self._coords:
                    note["coords"] = self._coords
                groups = process_groups()
                if groups:
                    note["process_groups"] = groups
            self._send(note)
        except Exception:
            self.dropped += 1

    def capture_state(self, capture, state, step, why=None):
        """Tells the agent (and so ``tpsprof trace``) that this rank accepted
        a capture or cannot take part in it. Never raises."""
        try:
            line = {"type": "capture", "id": str(capture), "job": self.job, "rank": self.rank,
                    "state": state, "step": int(step)}
            if why:
                line["why"] = str(why)[:500]
            self._send(line)
        except Exception:
            self.dropped += 1

    def poll_control(self):
        """Reads what the agent wrote on the connection (capture requests;
        on rank 0 the job's cluster figures, for the trackers),
        without blocking, and hands each line to ``on_control``; one system
        call. Never raises."""
        s = self._sock
        if s is None or (self.on_control is None and self.trackers is None):
            return
        try:
            data = s.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close()
            return
        if not data:  # the agent hung up
            self._close()
            return
        lines = (self._ctl + data).split(b"\n")
        self._ctl = lines.pop()
        if len(self._ctl) > 65536:
            self._ctl = b""
        for line in lines:
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    continue
                if obj.get("type") == "cluster":  # the job's cluster figures (rank 0)
                    if self.trackers is not None:
                        self.trackers.cluster(obj)
                elif self.on_control is not None:
                    self.on_control(obj)
            except Exception:
                pass

    def event(self, kind, name=None, start_unix_ns=None, end_unix_ns=None, step=None, detail=None):
        """Sends a run event (checkpoint_save, eval, ...). Never raises."""
        try:
            now = time.time_ns()
            ev = {"type": "event", "job": self.job, "attempt": self.attempt, "kind": kind, "rank": self.rank,
                  "start_unix_ns": start_unix_ns or now, "end_unix_ns": end_unix_ns or start_unix_ns or now}
            if name:
                ev["name"] = name
            if step is not None:
                ev["step"] = int(step)
            if detail:
                ev["detail"] = str(detail)[:1000]
            self._send(ev)
        except Exception:
            self.dropped += 1

    # -- transport --------------------------------------------------------
    def _send(self, obj):
        line = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        if self._sock is None and not self._connect():
            self.dropped += 1
            if not self._said_no_agent:
                # said once, at the first record dropped: a job run without
                # its agent dropped every record silently
                self._said_no_agent = True
                sys.stderr.write("tpsprof: no tpsprof agent at %s: nothing is recorded (records are dropped until "
                                 "one listens); run the job under `tpsprof launch`\n" % (self.path,))
            return
        if self._held is not None:  # batched: written as one at the batch's end
            if len(self._pending) + self._held_bytes + len(line) > self.max_pending_bytes:
                self.dropped += 1
                return
            self._held.append(line)
            self._held_bytes += len(line)
            return
        if len(self._pending) + len(line) > self.max_pending_bytes:
            self.dropped += 1  # the agent is not reading; keep the stream whole
            self._flush()
            return
        self._pending += line
        if self._flush():
            self.sent += 1

    def batch(self):
        """Until ``unbatch()``, lines are held and then written as one (one
        system call for a batch of records instead of one each)."""
        if self._held is None:
            self._held, self._held_bytes = [], 0

    def unbatch(self):
        """Writes the lines held since ``batch()``."""
        lines, self._held = self._held, None
        if not lines:
            return
        if self._sock is None:
            self.dropped += len(lines)  # the connection closed meanwhile
            return
        self._pending += b"".join(lines)
        if self._flush():
            self.sent += len(lines)

    def _flush(self):
        """Writes what is pending without blocking; False if the agent is gone."""
        if not self._pending:
            return True
        try:
            n = self._sock.send(self._pending)
            self._pending = self._pending[n:]
            return True
        except (BlockingIOError, InterruptedError):
            return True  # kernel buffer full: keep it pending
        except OSError:
            self._close()
            return False

    def _connect(self):
        now = time.monotonic()
        if now < self._next_try:
            return False
        self._next_try = now + self.reconnect_interval
        if not _own_socket(self.path, self._warned):
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(0.05)
            s.connect(self.path)
            s.setblocking(False)
        except OSError:
            s.close()
            return False
        self._sock = s
        self._pending = b""
        self._ctl = b""
        return True

    def _close(self):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        # A partial line would corrupt the next connection's stream: drop it.
        if self._pending:
            self.dropped += 1
        self._pending = b""

    def close(self, timeout=2.0):
        """Tries to write what is pending for up to ``timeout`` seconds, then disconnects."""
        deadline = time.monotonic() + timeout
        if self.trackers is not None:
            self.trackers.close(max(timeout, 1.0))
        while self._pending and self._sock is not None and time.monotonic() < deadline:
            if not self._flush():
                break
            if self._pending:
                time.sleep(0.005)
        self._close()


# The name the copied hook file used; kept so that older scripts still run.
TPSProf = Profiler


def private_dir_problem(path, root_too=False):
    """None when path is a folder (not a link) of this user (or, with
    root_too, root) that group and others cannot write; else why not. Only
    in such a folder can a file be written without another user planting a
    link at its name first."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return "%s: %s" % (path, e.strerror)
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a folder" % path
    if st.st_uid != os.geteuid() and not (root_too and st.st_uid == 0):
        return "%s belongs to uid %d, not to you (uid %d)" % (path, st.st_uid, os.geteuid())
    if st.st_mode & 0o022:
        return "%s is writable by group or others (mode %04o)" % (path, st.st_mode & 0o7777)
    return None


def writable_folder(path, sub=None):
    """Makes ready a folder a user named for tpsprof to write into (--tensorboard
    DIR): DIR is created (0700) where missing, else it must be a folder, not a
    link, of this user or root that group and others cannot write; sub, a
    folder of ours inside it (rank0), is created afresh (0700) or, from an
    earlier run, must be this user's alike. Returns the folder to write in
    (DIR or DIR/sub), or raises ValueError naming the component that fails:
    in another user's folder, or one they can write, a link planted at a
    file's name is followed, and the figures read and edited."""
    path = os.path.abspath(path)
    if not os.path.lexists(path):
        os.makedirs(path, 0o700, exist_ok=True)
    why = private_dir_problem(path, root_too=True)
    if why is None and sub:
        path = os.path.join(path, sub)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        why = private_dir_problem(path)
    if why is not None:
        raise ValueError(why + ": not writing there")
    return path


def create_private_file(path):
    """Creates path afresh (0600, never through a link: O_EXCL|O_NOFOLLOW);
    an old file of ours at that name is replaced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        os.unlink(path)
        fd = os.open(path, flags, 0o600)
    os.close(fd)


def _own_socket(path, warned):
    """False for a path that is not a socket or a socket another user owns
    (root aside: an agent run as a node service): in a shared /tmp another
    user could squat the default path and read the job's records."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        return False
    if st.st_uid not in (os.getuid(), 0):
        if path not in warned:  # said once per connection, not at each retry
            warned.add(path)
            sys.stderr.write("tpsprof: %s belongs to uid %d, not to you: not sending records there\n" % (path, st.st_uid))
        return False
    return True


def process_groups():
    """How many process groups this process belongs to (0: unknown, or
    torch.distributed not loaded). A CPU trace does not say which group
    each collective was of; the capture's merge says so where there are
    several. Never imports torch."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return 0
    try:
        world = getattr(c10d, "_world", None)
        pgs = getattr(world, "pg_map", None) if world is not None else None
        if pgs is None:
            pgs = getattr(c10d, "_pg_map", None)
        return len(pgs) if pgs is not None else 0
    except Exception:
        return 0
