"""A gloo job that closes its profiler with no time to spare (close's
failure paths call close(timeout=0)) and exits without destroying its
process group exits cleanly: before the sender gave up past close's
timeout, its thread was still building records at the interpreter's exit
and the process aborted there ("terminate called without an active
exception", every run of this job on torch 1.13)."""

import os
import socket
import subprocess
import sys
import tempfile
import unittest

JOB = r"""
import os, sys, torch, torch.nn as nn, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
import tpsprof.torch as tt
model = nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
prof = tt.instrument(model, opt, socket_path=sys.argv[2])
bufs = [torch.zeros(256) for _ in range(14)]
for _ in range(60):
    loss = model(torch.randn(4, 32)).sum()
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    for w in works:
        w.wait()
    loss.backward()
    opt.step()
    opt.zero_grad()
prof.close(timeout=0)
print("closed", prof.pending_dropped >= 0)
"""


class SenderExitTest(unittest.TestCase):
    def test_close_without_time_then_exit(self):
        pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        with tempfile.TemporaryDirectory() as d:
            for run in range(2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
                env.pop("TPSPROF_SOCKET", None)
                r = subprocess.run([sys.executable, "-c", JOB, pkg, os.path.join(d, "no-agent.sock")], env=env,
                                   capture_output=True, text=True, timeout=120)
                self.assertIn("closed True", r.stdout, r.stderr[-2000:])
                self.assertEqual(r.returncode, 0, "run %d: exit status %d\n%s" % (run, r.returncode, r.stderr[-2000:]))
                self.assertNotIn("terminate called", r.stderr)


if __name__ == "__main__":
    unittest.main()
