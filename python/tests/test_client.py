"""tpsprof's plain client: it never writes to another user's socket."""

import os
import socket
import tempfile
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
        self.assertFalse(_client._own_socket(path))
        p = tpsprof.Profiler(job="j", rank=0, world_size=1, socket_path=path)
        p.start(0)
        p.end(10)
        p.close(timeout=0.2)
        with self.assertRaises(socket.timeout):
            srv.accept()
        os.chown(path, os.getuid(), os.getgid())
        self.assertTrue(_client._own_socket(path))
        self.assertFalse(_client._own_socket(os.path.join(d, "missing.sock")))
        srv.close()


if __name__ == "__main__":
    unittest.main()
