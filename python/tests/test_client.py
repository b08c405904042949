"""tpsprof's plain client: it never writes to another user's socket."""

import os
import socket
import tempfile
import time
import unittest

import tpsprof
from tpsprof import _client


class ForeignSocketTest(unittest.TestCase):
    """Another user's socket at the path gets nothing (chown needs root:
    CI runs as root)."""

    @unittest.skipUnless(os.getuid() == 0, "needs root to give the socket to another uid")
    def test_refused(self):
        d = tempfile.mkdtemp()
        path = os.path.join(d, "squat.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(1)
        srv.settimeout(0.3)
        os.chown(path, 4242, 4242)
        self.assertFalse(_client._own_socket(path, set()))
        p = tpsprof.Profiler(job="j", rank=0, world_size=1, socket_path=path)
        p.start(0)
        p.end(10)
        p.close(timeout=0.2)
        with self.assertRaises(socket.timeout):
            srv.accept()
        os.chown(path, os.getuid(), os.getgid())
        self.assertTrue(_client._own_socket(path, set()))
        self.assertFalse(_client._own_socket(os.path.join(d, "missing.sock"), set()))
        srv.close()


class PrivateFolderTest(unittest.TestCase):
    """Traces are written only into a folder of ours that no one else can
    write, at a name created afresh (never through a planted link)."""

    def test_folder_checks(self):
        d = tempfile.mkdtemp()
        self.assertIsNone(_client.private_dir_problem(d))
        os.chmod(d, 0o777)
        self.assertIn("writable by group or others", _client.private_dir_problem(d))
        os.chmod(d, 0o700)
        link = d + ".link"
        os.symlink(d, link)
        self.assertIn("not a folder", _client.private_dir_problem(link))
        self.assertIsNotNone(_client.private_dir_problem(os.path.join(d, "missing")))

    @unittest.skipUnless(os.getuid() == 0, "needs root to give the folder to another uid")
    def test_foreign_folder(self):
        d = tempfile.mkdtemp()
        os.chown(d, 4242, 4242)
        self.assertIn("uid 4242", _client.private_dir_problem(d))

    def test_link_replaced_not_followed(self):
        d = tempfile.mkdtemp()
        victim = os.path.join(d, "victim")
        with open(victim, "w") as f:
            f.write("keep")
        os.chmod(victim, 0o600)
        path = os.path.join(d, "j.0.0.1.pt.trace.json")
        os.symlink(victim, path)
        _client.create_private_file(path)
        self.assertFalse(os.path.islink(path))
        with open(path, "w") as f:
            f.write("trace")
        with open(victim) as f:
            self.assertEqual(f.read(), "keep")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)



class BatchTest(unittest.TestCase):
    """Records held by batch() reach the agent whole and in order, in one
    write; what does not fit the pending bound is dropped and counted."""

    def test_batch_written_once(self):
        d = tempfile.mkdtemp()
        path = os.path.join(d, "a.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(1)
        p = tpsprof.Profiler(job="j", rank=0, world_size=1, socket_path=path, max_pending_bytes=4096)
        p.batch()
        for i in range(10):
            p.send_step(i, 1_000_000_000 + i, 100, 8)
        conn, _ = srv.accept()
        conn.settimeout(0.2)
        with self.assertRaises(socket.timeout):
            conn.recv(1)  # held: nothing written yet
        self.assertEqual(p.sent, 0)
        for i in range(10, 200):  # far past 4096 bytes: the rest is dropped
            p.send_step(i, 1_000_000_000 + i, 100, 8)
        p.unbatch()
        got = b""
        conn.settimeout(1.0)
        while not got.endswith(b"\n") or got.count(b"\n") < p.sent:
            got += conn.recv(1 << 16)
        lines = got.decode().splitlines()
        self.assertEqual(len(lines), p.sent)
        self.assertGreater(p.sent, 10)
        self.assertEqual(p.sent + p.dropped, 200)
        steps = [int(line.split('"step":')[1].split(",")[0]) for line in lines]
        self.assertEqual(steps, list(range(p.sent)))
        p.send_step(500, 2_000_000_000, 100, 8)  # unbatched again: written at once
        self.assertIn(b'"step":500', conn.recv(1 << 16))
        p.close(timeout=0.2)
        conn.close()
        srv.close()


class ControlTest(unittest.TestCase):
    """What the agent writes on the connection (a capture request) is read
    without blocking, whole lines only, and handed to on_control; a hang-up
    closes the connection."""

    def test_control_lines(self):
        d = tempfile.mkdtemp()
        path = os.path.join(d, "a.sock")
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(path)
        srv.listen(1)
        p = tpsprof.Profiler(job="j", rank=3, world_size=4, socket_path=path)
        got = []
        p.on_control = got.append
        p.send_step(0, 1_000_000_000, 100, 8)  # connects
        conn, _ = srv.accept()
        p.poll_control()  # nothing written: returns at once
        self.assertEqual(got, [])
        conn.sendall(b'{"type":"capture","id":"c1","at_step":5,"steps":2}\n{"type":"capt')
        deadline = time.monotonic() + 2
        while not got and time.monotonic() < deadline:
            p.poll_control()
        self.assertEqual(got, [{"type": "capture", "id": "c1", "at_step": 5, "steps": 2}])
        conn.sendall(b'ure","id":"c2","at_step":9,"steps":1}\nnot json\n')
        while len(got) < 2 and time.monotonic() < deadline:
            p.poll_control()
        self.assertEqual(got[1]["id"], "c2")
        p.capture_state("c2", "accepted", 8)
        line = conn.recv(1 << 16)
        self.assertIn(b'"type":"capture"', line)
        self.assertIn(b'"state":"accepted"', line)
        conn.close()
        while p._sock is not None and time.monotonic() < deadline:
            p.poll_control()
        self.assertIsNone(p._sock)
        srv.close()


if __name__ == "__main__":
    unittest.main()


class TrackersTest(unittest.TestCase):
    """tpsprof's figures for the job's own trackers (docs/trackers.md)."""

    def test_figures_of_a_record(self):
        from tpsprof import _trackers
        step, row = _trackers.figures({"step": 7, "duration_ns": 200_000_000, "tokens": 1000,
                                       "exposed_comm_ns": 50_000_000, "data_wait_ns": 30_000_000,
                                       "ckpt_ns": 20_000_000, "mem_peak_allocated_bytes": 3 << 30})
        self.assertEqual(step, 7)
        self.assertAlmostEqual(row["tpsprof/tokens_per_s"], 5000.0)
        self.assertAlmostEqual(row["tpsprof/step_time_s"], 0.2)
        self.assertAlmostEqual(row["tpsprof/share/compute"], 0.5)
        self.assertAlmostEqual(row["tpsprof/share/exposed_comm"], 0.25)
        self.assertAlmostEqual(row["tpsprof/share/data_stall"], 0.15)
        self.assertAlmostEqual(row["tpsprof/share/checkpoint"], 0.1)
        self.assertEqual(row["tpsprof/share/bubble"], 0.0)
        self.assertAlmostEqual(row["tpsprof/mem_peak_allocated_gib"], 3.0)
        # no tokens: no throughput (unknown, not zero); blocking parts past
        # the step are scaled to it, never a share above 1
        _, row = _trackers.figures({"step": 1, "duration_ns": 100, "tokens": 0,
                                    "exposed_comm_ns": 100, "data_wait_ns": 100})
        self.assertNotIn("tpsprof/tokens_per_s", row)
        self.assertAlmostEqual(sum(v for k, v in row.items() if k.startswith("tpsprof/share/")), 1.0)
        self.assertEqual(row["tpsprof/share/compute"], 0.0)
        self.assertIsNone(_trackers.figures({"step": 1, "duration_ns": 0}))
        # the thread's own work before the forward (host_ns): host/other's
        # share at a rank, out of compute, and its split
        _, row = _trackers.figures({"step": 2, "duration_ns": 200_000_000, "tokens": 1000,
                                    "data_wait_ns": 30_000_000, "host_ns": 40_000_000})
        self.assertAlmostEqual(row["tpsprof/share/host_other"], 0.2)
        self.assertAlmostEqual(row["tpsprof/split/host"], 0.2)
        self.assertAlmostEqual(row["tpsprof/share/compute"], 0.65)
        self.assertAlmostEqual(sum(v for k, v in row.items() if k.startswith("tpsprof/share/")), 1.0)

    def test_no_tracker_nothing_imported_no_thread(self):
        import subprocess
        import sys
        code = (
            "import sys, threading, tpsprof\n"
            "p = tpsprof.Profiler(job='j', rank=0, world_size=1, socket_path='/nonexistent/x.sock')\n"
            "for s in range(5):\n"
            "    p.start(s); p.end(100)\n"
            "p.close(timeout=0.1)\n"
            "mods = [m for m in ('wandb', 'mlflow', 'tensorboard', 'torch.utils.tensorboard', 'tensorboardX') if m in sys.modules]\n"
            "threads = [t.name for t in threading.enumerate() if t.name.startswith('tpsprof-trackers')]\n"
            "print(mods, threads, p.trackers is not None)\n")
        env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        env.pop("TPSPROF_TRACKERS", None)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.stdout.strip(), "[] [] True", out.stderr)
        env["TPSPROF_TRACKERS"] = "0"
        out = subprocess.run([sys.executable, "-c", code.replace("p.trackers is not None", "p.trackers is None")],
                             env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.stdout.strip(), "[] [] True", out.stderr)


    def test_closed_writer_left_alone(self):
        """A SummaryWriter the job closed gets no later row (the cluster's
        figures after its last step): writing into it would reopen it as a
        second event file, which CI saw in a Lightning run's folder. The
        job writing to it again makes it ours to write to again, the rows
        kept meanwhile included."""
        import glob
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as e:  # bookworm's torch 1.13 has no tensorboard package (sid's does)
            self.skipTest("no tensorboard: %s" % (e,))
        from tpsprof._trackers import Trackers
        d = tempfile.mkdtemp()
        t = Trackers(rank=0, interval=3600)
        t._look()  # finds the SummaryWriter class: its add_scalar and close are watched
        w = SummaryWriter(log_dir=d)
        w.add_scalar("loss", 1.0, 0)  # the job's writer, found at its call
        t._tensorboard([(0, {"tpsprof/step_time_s": 0.1})])
        w.close()
        t._tensorboard([(1, {"tpsprof/cluster/tokens_per_s": 5.0})])
        files = glob.glob(os.path.join(d, "events.out.tfevents.*"))
        self.assertEqual(len(files), 1, files)
        w.add_scalar("loss", 2.0, 2)  # the job reopens it
        t._tensorboard([(2, {"tpsprof/step_time_s": 0.1})])
        w.close()
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        acc = EventAccumulator(d)
        acc.Reload()
        self.assertEqual([e.step for e in acc.Scalars("tpsprof/step_time_s")], [0, 2])
        # the row that came while it was closed waited for it, nothing lost
        self.assertEqual([e.step for e in acc.Scalars("tpsprof/cluster/tokens_per_s")], [1])


class NoAgentTest(unittest.TestCase):
    def test_said_once_and_counted(self):
        """instrument() with no agent listening: one line on stderr at the
        first record dropped, naming the socket and tpsprof launch; the
        drops counted (303 records went silently before)."""
        import contextlib
        import io
        import tempfile
        path = os.path.join(tempfile.mkdtemp(), "none.sock")
        p = tpsprof.Profiler(job="j", rank=0, world_size=1, attempt=0, socket_path=path)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            for i in range(5):
                p.send_step(i, time.time_ns(), 1000, 10, {})
        self.assertEqual(p.dropped, 5)
        lines = [l for l in err.getvalue().splitlines() if l]
        self.assertEqual(len(lines), 1, lines)
        self.assertIn("no tpsprof agent at %s" % path, lines[0])
        self.assertIn("tpsprof launch", lines[0])


class WritableFolderTest(unittest.TestCase):
    """--tensorboard DIR: DIR and its rank folders are checked before
    anything is written there (another user's pre-created DIR/rank0 with
    planted links had root's files overwritten)."""

    def test_checks(self):
        base = tempfile.mkdtemp()
        d = os.path.join(base, "tb")
        got = _client.writable_folder(d, "rank0")
        self.assertEqual(got, os.path.join(d, "rank0"))
        self.assertEqual(os.stat(got).st_mode & 0o777, 0o700)
        self.assertEqual(_client.writable_folder(d, "rank0"), got)  # an earlier run's: ours, kept
        # a folder others can write
        os.chmod(got, 0o777)
        with self.assertRaisesRegex(ValueError, "rank0 is writable by group or others"):
            _client.writable_folder(d, "rank0")
        os.chmod(got, 0o700)
        # a link where the rank folder goes
        os.symlink(base, os.path.join(d, "rank1"))
        with self.assertRaisesRegex(ValueError, "rank1 is not a folder"):
            _client.writable_folder(d, "rank1")
        # DIR itself a link
        link = os.path.join(base, "via")
        os.symlink(d, link)
        with self.assertRaisesRegex(ValueError, "via is not a folder"):
            _client.writable_folder(link, "rank0")

    def test_another_users_rank_folder(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to make another user's folder")  # (CI runs as root)
        base = tempfile.mkdtemp()
        d = os.path.join(base, "tb")
        os.mkdir(d, 0o700)
        planted = os.path.join(d, "rank0")
        os.mkdir(planted, 0o755)
        os.chown(planted, 4242, 4242)
        with self.assertRaisesRegex(ValueError, "rank0 belongs to uid 4242"):
            _client.writable_folder(d, "rank0")
        os.chown(d, 4242, 4242)
        with self.assertRaisesRegex(ValueError, "tb belongs to uid 4242"):
            _client.writable_folder(d, "rank0")


class IdentityTest(unittest.TestCase):
    """A job name or attempt the agent refuses (TPSPROF_JOB="bad job name",
    TPSPROF_ATTEMPT=99999999999999999999) is said once on stderr, the job
    running on: every record was refused at the agent, the job told
    nothing."""

    def test_bad_job_name_and_attempt_said(self):
        import contextlib
        import io
        for job, attempt, want in (("bad job name", 0, "job name"), ("ok", 99999999999999999999, "attempt"), ("ok-1_x", 3, "")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                p = _client.Profiler(job=job, attempt=attempt, socket_path="/nonexistent/a.sock")
            self.assertEqual(bool(p.invalid), bool(want), (job, attempt, p.invalid))
            if want:
                self.assertIn(want, p.invalid)
                self.assertEqual(err.getvalue().count("nothing will be recorded"), 1, err.getvalue())
            else:
                self.assertNotIn("nothing will be recorded", err.getvalue())


class SlurmRankTest(unittest.TestCase):
    """A task a rank under srun (the script taking its rank from nowhere):
    rank and world from SLURM_PROCID and SLURM_NTASKS, the job id
    slurm-$SLURM_JOB_ID; once the job has made a process group, its rank
    and world size win (each task read rank 0 of world 1: the collector
    kept one's records, the report said 1 rank and half the TPS)."""

    def setUp(self):
        self.saved = dict(os.environ)
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TPSPROF_JOB", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
            os.environ.pop(k, None)

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self.saved)

    def test_slurm_variables(self):
        os.environ.update(SLURM_JOB_ID="4242", SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_LOCALID="1")
        p = _client.Profiler(socket_path="/nonexistent/a.sock")
        self.assertEqual((p.job, p.rank, p.world_size, p.local_rank), ("slurm-4242", 1, 2, 1))
        os.environ.update(SLURM_ARRAY_JOB_ID="4240", SLURM_ARRAY_TASK_ID="3")
        self.assertEqual(_client.Profiler(socket_path="/nonexistent/a.sock").job, "slurm-4240_3")
        os.environ.update(RANK="0", WORLD_SIZE="4")  # torchrun's win over srun's
        p = _client.Profiler(socket_path="/nonexistent/a.sock")
        self.assertEqual((p.rank, p.world_size), (0, 4))

    def test_process_group_wins(self):
        import subprocess
        import sys
        job = r"""
import os, sys, tempfile
sys.path.insert(0, sys.argv[1])
os.environ.update(SLURM_JOB_ID="1", SLURM_PROCID="3", SLURM_NTASKS="4")
import torch.distributed as dist
from tpsprof import _client
p = _client.Profiler(socket_path="/nonexistent/a.sock")
before = (p.rank, p.world_size)
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
p.send_step(0, 1, 1000, 10)
print("ranks", before, (p.rank, p.world_size))
"""
        pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        r = subprocess.run([sys.executable, "-W", "ignore", "-c", job, pkg], capture_output=True, text=True, timeout=120)
        self.assertIn("ranks (3, 4) (0, 1)", r.stdout, r.stderr[-2000:])
