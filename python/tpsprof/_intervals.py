"""Interval arithmetic for one step: unions, differences, exposed communication.

Intervals are (start, end) pairs of integers (nanoseconds from any origin).
Pure functions, no PyTorch: the same code serves host clocks (CPU) and CUDA
event times (GPU). docs/capture.md gives the method.
"""

__all__ = ["union", "length", "subtract", "intersect", "clip", "exposed"]


def union(intervals):
    """Sorted, disjoint intervals covering the same time as ``intervals``."""
    out = []
    for a, b in sorted((a, b) for a, b in intervals if b > a):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def length(intervals):
    """Total time covered by ``intervals`` (overlaps counted once)."""
    return sum(b - a for a, b in union(intervals))


def subtract(xs, ys):
    """The time of ``xs`` not covered by ``ys`` (both any intervals)."""
    xs, ys = union(xs), union(ys)
    out, j = [], 0
    for a, b in xs:
        while j < len(ys) and ys[j][1] <= a:
            j += 1
        k, cur = j, a
        while k < len(ys) and ys[k][0] < b:
            if ys[k][0] > cur:
                out.append((cur, ys[k][0]))
            cur = max(cur, ys[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def intersect(xs, ys):
    """The time covered by both ``xs`` and ``ys``."""
    return subtract(xs, subtract(xs, ys))


def clip(intervals, lo, hi):
    """``intervals`` cut to [lo, hi]."""
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def exposed(comm, compute, blocked=()):
    """(comm_ns, exposed_ns): the union of communication, and the part of it
    that no compute interval hides. ``blocked`` are times the compute stream
    (or the host, on CPU) spent waiting inside a compute interval, for
    example in a synchronous collective: they hide nothing."""
    busy = subtract(compute, blocked)
    c = union(comm)
    return length(c), length(subtract(c, busy))
