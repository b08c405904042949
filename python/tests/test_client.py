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
