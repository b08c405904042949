"""The collector's pauses (tpsprof._gc) and where they go in a step's
phases (tpsprof._steps): measured on the thread that trains only, taken
out of the phases they fell in, each pause once."""

import gc
import threading
import unittest

from tpsprof._gc import MAX_PAUSES, GCPauses
from tpsprof._measures import MEASURES, SPLITS
from tpsprof._steps import phases
from tpsprof._trackers import figures

MS = 1_000_000


class GCPausesTest(unittest.TestCase):
    def test_pauses_of_this_thread_only(self):
        p = GCPauses()
        p.install()
        try:
            gc.collect()
            gc.collect()
            mine = p.take()
            t = threading.Thread(target=gc.collect)
            t.start()
            t.join()
            theirs = p.take()
        finally:
            p.remove()
        self.assertEqual(len(mine), 2)
        self.assertTrue(all(b >= a for a, b in mine))
        self.assertEqual(theirs, [])  # another thread's run pauses that thread
        gc.collect()
        self.assertEqual(p.take(), [])  # removed: nothing more

    def test_bounded_between_takes(self):
        ticks = iter(range(10 ** 6))
        p = GCPauses(clock=lambda: next(ticks))
        for _ in range(MAX_PAUSES + 5):
            p._callback("start", {})
            p._callback("stop", {})
        self.assertEqual((len(p.take()), p.dropped), (MAX_PAUSES, 5))

    def test_a_callback_never_raises(self):
        def boom():
            raise RuntimeError("clock")
        p = GCPauses(clock=boom)
        p._callback("start", {})
        self.assertEqual(p.errors, 1)


class PausesInPhasesTest(unittest.TestCase):
    def test_taken_out_of_the_phases_they_fell_in(self):
        # forward 0-40 with a 5 ms pause at 10, backward 40-90 with one at
        # 60 (3 ms), one more between the backward and the optimizer (2 ms)
        got = phases(100 * MS, 0, [(0, 40 * MS)], [(40 * MS, 90 * MS)], [], [(92 * MS, 100 * MS)],
                     gc=[(10 * MS, 15 * MS), (60 * MS, 63 * MS), (90 * MS, 92 * MS)])
        self.assertEqual((got["fwd"], got["bwd"], got["optim"], got["gc"]), (35 * MS, 47 * MS, 8 * MS, 10 * MS))

    def test_cut_to_the_step(self):
        got = phases(10 * MS, 0, [(0, 10 * MS)], [], [], [], gc=[(-3 * MS, 2 * MS), (9 * MS, 12 * MS)])
        self.assertEqual((got["fwd"], got["gc"]), (7 * MS, 3 * MS))

    def test_none_no_key(self):
        self.assertNotIn("gc", phases(10, 0, [(0, 10)], [], [], []))


class TableTest(unittest.TestCase):
    def test_gc_is_declared_by_the_go_table(self):
        # (python/tpsprof/_measures.py is generated from tps/measures.go)
        self.assertEqual(MEASURES["gc_ns"][0], "phase")
        self.assertEqual(SPLITS["gc_ns"][0], "compute")

    def test_tracker_row_carries_the_split(self):
        step, row = figures({"step": 3, "duration_ns": 100 * MS, "tokens": 10, "gc_ns": 4 * MS})
        self.assertEqual(step, 3)
        self.assertAlmostEqual(row["tpsprof/split/gc"], 0.04)


if __name__ == "__main__":
    unittest.main()


class ClusterLedgerTest(unittest.TestCase):
    def test_mfu_lost_points_reach_the_trackers(self):
        # (the collector's published figures: MFU 0.30, its ledger's lost points)
        from tpsprof._trackers import Trackers
        t = Trackers(rank=0)
        t._active = True
        t.cluster({"job": "j", "step": 9, "window_steps": 10, "mfu": 0.30, "shares": {"compute": 1.0},
                   "mfu_lost": {"compute_efficiency": 70.0, "data_stall": 0.0}})
        step, row = t._cluster_row
        self.assertEqual(step, 9)
        self.assertEqual(row["tpsprof/cluster/mfu_lost/compute_efficiency"], 70.0)
        self.assertAlmostEqual(100 * row["tpsprof/cluster/mfu"] + sum(
            v for k, v in row.items() if k.startswith("tpsprof/cluster/mfu_lost/")), 100)
