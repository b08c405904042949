"""The completion poller (tpsprof._sender.Poller): how often it looks at a
collective long in flight, and that an end it notes is never before the
completion. The works are torch.futures.Future, PyTorch's own future (a
gloo work's completion is read the same way), counted by a subclass."""

import threading
import time
import unittest

import torch

from tpsprof._sender import Poller


class Counted(torch.futures.Future):
    def __init__(self):
        super().__init__()
        self.looks = 0

    def is_completed(self):  # (a Work's name for a future's done())
        self.looks += 1
        return self.done()


class PollerTest(unittest.TestCase):
    def test_backs_off_on_a_long_collective(self):
        p = Poller()
        try:
            fut = Counted()
            cell = [time.perf_counter_ns(), None]
            p.watch(cell, [fut])
            time.sleep(0.1)
            done = time.perf_counter_ns()
            fut.set_result(None)
            deadline = time.monotonic() + 5
            while cell[1] is None and time.monotonic() < deadline:
                time.sleep(0.001)
            self.assertIsNotNone(cell[1], "the completion was not noted")
            self.assertGreaterEqual(cell[1], done, "noted before it completed")
            # every 0.2 ms for 100 ms would be ~400 looks (300 measured before
            # the back-off: sleep's overshoot); backing off to an eighth of
            # its age, at most 1 ms: ~120 at the most (87 measured)
            self.assertLess(fut.looks, 150, fut.looks)
            self.assertGreater(fut.looks, 5, fut.looks)
            # a young one is still looked at every 0.2 ms: noted within a
            # few ms of its completion on an idle machine (loosely here)
            young = Counted()
            cell2 = [time.perf_counter_ns(), None]
            p.watch(cell2, [young])
            threading.Timer(0.002, young.set_result, (None,)).start()
            deadline = time.monotonic() + 5
            while cell2[1] is None and time.monotonic() < deadline:
                time.sleep(0.001)
            self.assertIsNotNone(cell2[1])
            self.assertLess(cell2[1] - cell2[0], 200_000_000)
        finally:
            p.stop()


if __name__ == "__main__":
    unittest.main()
