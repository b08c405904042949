"""Interval arithmetic for one step: unions, differences, exposed communication.

Intervals are (start, end) pairs of integers (nanoseconds from any origin).
Pure functions, no PyTorch: the same code serves host clocks (CPU) and CUDA
event times (GPU). docs/capture.md gives the method.
"""

__all__ = ["union", "length", "subtract", "intersect", "clip", "exposed"]


def union(intervals):
    """Sorted, disjoint intervals covering the same time as ``intervals``."""
    if intervals.__class__ is not list:
        intervals = list(intervals)
    if len(intervals) < 2:  # (most of a step's phases: one interval)
        if intervals:
            a, b = intervals[0]
            if b > a:
                return [(a, b)]
        return []
    try:
        ordered = sorted(intervals)
    except TypeError:  # lists and tuples mixed
        ordered = sorted((a, b) for a, b in intervals)
    out = []
    ca = cb = None
    for a, b in ordered:
        if b <= a:
            continue
        if cb is not None and a <= cb:
            if b > cb:
                cb = b
        else:
            if cb is not None:
                out.append((ca, cb))
            ca, cb = a, b
    if cb is not None:
        out.append((ca, cb))
    return out


def length(intervals):
    """Total time covered by ``intervals`` (overlaps counted once)."""
    n = 0
    for a, b in union(intervals):
        n += b - a
    return n


def subtract(xs, ys):
    """The time of ``xs`` not covered by ``ys`` (both any intervals)."""
    xs = union(xs)
    if not xs:
        return xs
    ys = union(ys)
    if not ys:
        return xs
    out, j, n = [], 0, len(ys)
    for a, b in xs:
        while j < n and ys[j][1] <= a:
            j += 1
        k, cur = j, a
        while k < n and ys[k][0] < b:
            y0, y1 = ys[k]
            if y0 > cur:
                out.append((cur, y0))
            if y1 > cur:
                cur = y1
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def intersect(xs, ys):
    """The time covered by both ``xs`` and ``ys``."""
    if not xs or not ys:
        return []
    return subtract(xs, subtract(xs, ys))


def clip(intervals, lo, hi):
    """``intervals`` cut to [lo, hi]."""
    out = []
    for a, b in intervals:
        if a < lo:
            a = lo
        if b > hi:
            b = hi
        if b > a:
            out.append((a, b))
    return out


def exposed(comm, compute, blocked=()):
    """(comm_ns, exposed_ns): the union of communication, and the part of it
    that no compute interval hides. ``blocked`` are times the compute stream
    (or the host, on CPU) spent waiting inside a compute interval, for
    example in a synchronous collective: they hide nothing."""
    busy = subtract(compute, blocked)
    c = union(comm)
    return length(c), length(subtract(c, busy))
