import unittest

from tpsprof._intervals import clip, exposed, intersect, length, subtract, union


class IntervalTest(unittest.TestCase):
    def test_union_merges_overlaps_and_touching(self):
        self.assertEqual(union([(5, 8), (0, 3), (2, 4), (8, 9), (12, 12)]), [(0, 4), (5, 9)])

    def test_length_counts_overlap_once(self):
        self.assertEqual(length([(0, 10), (5, 15), (20, 21)]), 16)

    def test_subtract(self):
        self.assertEqual(subtract([(0, 10), (20, 30)], [(2, 3), (5, 25)]), [(0, 2), (3, 5), (25, 30)])
        self.assertEqual(subtract([(0, 10)], []), [(0, 10)])
        self.assertEqual(subtract([(0, 10)], [(0, 10)]), [])

    def test_intersect(self):
        self.assertEqual(intersect([(0, 10)], [(5, 20), (-5, 1)]), [(0, 1), (5, 10)])

    def test_clip(self):
        self.assertEqual(clip([(-5, 5), (8, 20), (30, 40)], 0, 10), [(0, 5), (8, 10)])

    def test_exposed_known_answer(self):
        # compute 0-100 with a synchronous collective blocking 40-50 inside
        # it; communication 40-50 (the blocking one) and 80-130 (async).
        comm, exp = exposed([(40, 50), (80, 130)], [(0, 100)], [(40, 50)])
        self.assertEqual(comm, 60)
        self.assertEqual(exp, 10 + 30)  # 40-50 blocked, 100-130 after compute

    def test_exposed_fully_hidden(self):
        self.assertEqual(exposed([(10, 20), (15, 30)], [(0, 50)]), (20, 0))

    def test_exposed_never_above_comm(self):
        import random
        rnd = random.Random(7)
        for _ in range(500):
            ivs = lambda: [(a, a + rnd.randint(0, 50)) for a in (rnd.randint(0, 200) for _ in range(rnd.randint(0, 6)))]
            c, e = exposed(ivs(), ivs(), ivs())
            self.assertLessEqual(e, c)
            self.assertGreaterEqual(e, 0)

    def test_against_points(self):
        # each function against the same sets as sets of unit points, on
        # random intervals (empty, reversed, touching, one, lists and tuples
        # mixed): the fast paths (one interval, nothing to subtract) agree
        # with the general one
        import random
        rnd = random.Random(11)

        def pts(ivs):
            return {t for a, b in ivs for t in range(a, b)}

        def runs(points):
            out, ps = [], sorted(points)
            for t in ps:
                if out and out[-1][1] == t:
                    out[-1] = (out[-1][0], t + 1)
                else:
                    out.append((t, t + 1))
            return out

        def ivs():
            out = []
            for _ in range(rnd.choice((0, 1, 1, 2, 3, 6))):
                a = rnd.randint(-20, 120)
                iv = (a, a + rnd.randint(-5, 40))
                out.append(list(iv) if rnd.random() < 0.3 else iv)
            return out
        for _ in range(3000):
            xs, ys = ivs(), ivs()
            self.assertEqual(union(xs), runs(pts(xs)), xs)
            self.assertEqual(length(xs), len(pts(xs)), xs)
            self.assertEqual(subtract(xs, ys), runs(pts(xs) - pts(ys)), (xs, ys))
            self.assertEqual(intersect(xs, ys), runs(pts(xs) & pts(ys)), (xs, ys))
            self.assertEqual(clip(xs, 0, 100), [iv for iv in ((max(a, 0), min(b, 100)) for a, b in xs) if iv[1] > iv[0]], xs)


if __name__ == "__main__":
    unittest.main()
