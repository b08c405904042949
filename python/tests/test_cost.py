"""The training thread's cost (tpsprof._cost): each hook's time counted
once, the communication component's part apart, split at a step's end.
Torch-free: the hooks are stand-ins on a host clock of the test's own."""

import threading
import unittest

from tpsprof._cost import Cost, owned


class Clock:
    def __init__(self):
        self.t = 1_000

    def __call__(self):
        return self.t


class Prof:
    def __init__(self, clock):
        self.cost = Cost()
        self.clock = clock
        self.comm = Comm(self)

    def hook(self, ns, comm_inside=0, meanwhile=None):
        self.clock.t += ns
        if comm_inside:
            self.comm.mark(comm_inside)  # a mark inside a hook: counted once, in the hook
        if meanwhile is not None:
            meanwhile()


class Comm:
    def __init__(self, prof):
        self.prof = prof

    def mark(self, ns):
        self.prof.clock.t += ns


class CostTest(unittest.TestCase):
    def setUp(self):
        self.clock = Clock()
        self.hook = owned(Prof.hook, clock=self.clock)
        self.mark = owned(Comm.mark, component=True, clock=self.clock)

    def test_split_by_component(self):
        p = Prof(self.clock)
        self.hook(p, 300)
        self.mark(p.comm, 40)
        self.mark(p.comm, 60)
        self.hook(p, 200, comm_inside=50)  # 250 ns, the hook's
        own, comm = p.cost.step_finished()
        self.assertEqual((own, comm), (300 + 40 + 60 + 250, 100))
        self.assertEqual(p.cost.step_finished(), (0, 0))
        self.assertEqual(p.cost.total_ns, 650)

    def test_a_hook_per_thread(self):
        # a hook on another thread (autograd's) while this one is inside
        # one is not inside it: it counts its own time
        p = Prof(self.clock)
        got = []

        def other():
            got.append(p.cost.in_hook.t0)
            self.mark(p.comm, 30)

        def meanwhile():
            t = threading.Thread(target=other)
            t.start()
            t.join()
        self.hook(p, 10, meanwhile=meanwhile)
        self.assertEqual(got, [0])
        # the other thread's 30 ns counted once as communication; this
        # hook's span holds them too (one clock for both threads here)
        self.assertEqual(p.cost.step_finished(), (30 + 40, 30))


if __name__ == "__main__":
    unittest.main()
