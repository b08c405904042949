"""The torch-free core (tpsprof._steps): a step's phases and totals from
plain numbers, and the proof that it needs no PyTorch."""

import os
import subprocess
import sys
import unittest

from tpsprof._steps import Step, mean_loss, phases, totals

MS = 1_000_000


class PhasesTest(unittest.TestCase):
    def test_ddp_like_step(self):
        # a 100 ms step: 5 ms data, forward 5-35, loss 35-40, backward 40-80,
        # optimizer 90-100; two all-reduces, 50-70 (under the backward) and
        # 75-90 (its last 10 ms after the backward: exposed)
        got = phases(100 * MS, 5 * MS, [(5 * MS, 35 * MS)], [(40 * MS, 80 * MS)], [(35 * MS, 40 * MS)],
                     [(90 * MS, 100 * MS)], comm=[(50 * MS, 70 * MS), (75 * MS, 90 * MS)])
        self.assertEqual(got, {"data_wait": 5 * MS, "fwd": 30 * MS, "bwd": 40 * MS, "optim": 10 * MS,
                               "comm": 35 * MS, "exposed_comm": 10 * MS})

    def test_blocked_time_hides_nothing(self):
        # a synchronous all-reduce inside the backward (60-70): the backward
        # interval covers it, but the host was blocked in it
        got = phases(100 * MS, 0, [], [(0, 80 * MS)], [], [], comm=[(60 * MS, 70 * MS)],
                     blocked=[(60 * MS, 70 * MS)])
        self.assertEqual((got["comm"], got["exposed_comm"]), (10 * MS, 10 * MS))

    def test_pipeline_wait_is_not_communication(self):
        # a receive 0-30 ms waiting for the previous stage, forward 30-60
        got = phases(60 * MS, 0, [(30 * MS, 60 * MS)], [], [], [], comm=[(0, 30 * MS)], pp_wait=[(0, 25 * MS)])
        self.assertEqual(got["pp_wait"], 25 * MS)
        self.assertEqual((got["comm"], got["exposed_comm"]), (5 * MS, 5 * MS))

    def test_intervals_outside_the_step_are_cut(self):
        got = phases(10, 0, [(-5, 4)], [(8, 30)], [], [], comm=[(9, 50)])
        self.assertEqual((got["fwd"], got["bwd"], got["comm"], got["exposed_comm"]), (4, 2, 1, 0))

    def test_no_communication_no_comm_phase(self):
        self.assertNotIn("comm", phases(10, 0, [(0, 5)], [], [], []))


class TotalsTest(unittest.TestCase):
    def test_sums_and_packing(self):
        self.assertEqual(totals([(10, 16, 2, 50), (6, 16, 2, 20)]), (16, 32, 4, 70))
        # one batch not packed: no exact attention term
        self.assertEqual(totals([(10, 16, 2, 50), (6, 16, 2, None)]), (16, 32, 4, None))
        # a batch without tokens has no say
        self.assertEqual(totals([(0, 0, 0, False), (6, 16, 2, 20)]), (6, 16, 2, 20))
        self.assertEqual(totals([(0, 0, 0, False)]), (0, 0, 0, None))
        self.assertEqual(totals([]), (0, 0, 0, None))

    def test_skipped_step_trained_on_nothing(self):
        self.assertEqual(totals([(10, 16, 2, None)], skipped=True), (0, 0, 2, None))

    def test_mean_loss(self):
        self.assertEqual(mean_loss([1.0, 2.0, 4.5]), 2.5)
        self.assertIsNone(mean_loss([]))
        self.assertIsNone(mean_loss(["x"]))


class NoTorchTest(unittest.TestCase):
    def test_core_imports_without_torch(self):
        # PyTorch made unimportable: the core and its interval math still load and work
        code = ("import sys; sys.modules['torch'] = None\n"
                "from tpsprof._steps import Step, phases\n"
                "s = Step(0, 0)\n"
                "assert phases(10, 0, [(0, 4)], [(4, 9)], [], [], comm=[(6, 10)]) == "
                "{'data_wait': 0, 'fwd': 4, 'bwd': 5, 'optim': 0, 'comm': 4, 'exposed_comm': 1}\n"
                "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n")
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
