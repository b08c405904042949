"""The last step of a process arrives whatever ends it (a finished step
waits for the next iteration's first activity or close()): a Ray Train
worker that returns after destroy_process_group and lives on, a SIGTERM
the job does not catch. Ray Train under --auto lost its last step (29 rows
for 30 steps)."""

import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_torch import Sink  # noqa: E402

JOB = r"""
import os, sys, time, torch, torch.nn as nn, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import tpsprof.torch as tt
end = sys.argv[3]
if end == "destroy":
    dist.init_process_group("gloo", init_method="file://" + sys.argv[4], rank=0, world_size=1)
model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
prof = tt.instrument(model, opt, job="last", socket_path=sys.argv[2])
for _ in range(5):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
if end == "destroy":
    dist.destroy_process_group()  # a worker's function returns; the process lives on
print("ready", flush=True)
time.sleep(60)
"""


class LastStepTest(unittest.TestCase):
    def run_job(self, end):
        sink = Sink()
        pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("TPSPROF_SOCKET", None)
        p = subprocess.Popen([sys.executable, "-W", "ignore", "-c", JOB, pkg, sink.path, end, os.path.join(sink.dir, "store")],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            self.assertEqual(p.stdout.readline().strip(), "ready", p.stderr.read() if p.poll() is not None else "")
            return p, sink
        except BaseException:
            p.kill()
            raise

    def test_destroy_process_group_sends_the_last_step(self):
        p, sink = self.run_job("destroy")
        try:
            rows = sink.records(5, timeout=5.0)  # the process still alive, idle
            self.assertIsNone(p.poll())
            self.assertEqual([r["step"] for r in rows], [0, 1, 2, 3, 4])
        finally:
            p.kill()
            p.wait()

    def test_uncaught_sigterm_sends_the_last_step(self):
        p, sink = self.run_job("term")
        try:
            time.sleep(0.2)
            p.send_signal(signal.SIGTERM)
            self.assertEqual(p.wait(timeout=10), -signal.SIGTERM)  # killed by it, as without tpsprof
            self.assertEqual([r["step"] for r in sink.records(5, timeout=5.0)], [0, 1, 2, 3, 4])
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    unittest.main()
