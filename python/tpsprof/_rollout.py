"""Generation (RL rollout) measurements: a mergeable quantile sketch and
the per-step recorder behind ``prof.rollout()``. Stdlib only.

The sketch is the one the collector merges (tps.Sketch in Go, DDSketch):
bucket i = ceil(log_gamma(x)), gamma = (1 + 0.01) / (1 - 0.01); the
collector adds bucket counts across ranks and steps, so percentiles merge
exactly, within 1% relative error.
"""

import math
import time

ALPHA = 0.01
_LOG_GAMMA = math.log((1 + ALPHA) / (1 - ALPHA))
_MIN_VALUE = 1e-9
_MAX_BINS = 2048


class Sketch:
    __slots__ = ("count", "sum", "min", "max", "zero", "offset", "bins")

    def __init__(self):
        self.count, self.sum, self.min, self.max, self.zero = 0, 0.0, 0.0, 0.0, 0
        self.offset, self.bins = 0, []

    def add(self, x):
        try:
            x = float(x)
        except (TypeError, ValueError):
            return
        if not (x >= 0) or x == float("inf"):
            return
        if self.count == 0 or x < self.min:
            self.min = x
        if self.count == 0 or x > self.max:
            self.max = x
        self.count += 1
        self.sum += x
        if x < _MIN_VALUE:
            self.zero += 1
            return
        i = int(math.ceil(math.log(x) / _LOG_GAMMA))
        if not self.bins:
            self.offset, self.bins = i, [1]
            return
        if i < self.offset:
            self.bins[:0] = [0] * (self.offset - i)
            self.offset = i
        elif i - self.offset >= len(self.bins):
            self.bins.extend([0] * (i - self.offset - len(self.bins) + 1))
        self.bins[i - self.offset] += 1
        if len(self.bins) > _MAX_BINS:  # fold the lowest buckets into one
            k = len(self.bins) - _MAX_BINS
            folded = sum(self.bins[:k + 1])
            self.bins = self.bins[k:]
            self.bins[0] = folded
            self.offset += k

    def to_json(self):
        return {"count": self.count, "sum": self.sum, "min": self.min, "max": self.max, "zero": self.zero,
                "offset": self.offset, "bins": self.bins}


class Rollout:
    """What one step's generation phase did. Obtained from
    ``with prof.rollout() as r:``; for each request generated, call
    :meth:`request`. Never raises."""

    def __init__(self):
        self.requests = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.ns = 0
        self.ttft = Sketch()
        self.itl = Sketch()

    def request(self, prompt_tokens, output_tokens, ttft=None, itl=None, token_times=None, start=None):
        """One generated request: its prompt and generated token counts,
        and its latencies: ``ttft`` (seconds to the first generated token)
        and ``itl`` (seconds between consecutive generated tokens, an
        iterable); or ``token_times``, the ``time.perf_counter()`` of each
        generated token, with ``start``, when the request was submitted."""
        try:
            self.requests += 1
            self.prompt_tokens += max(int(prompt_tokens), 0)
            self.output_tokens += max(int(output_tokens), 0)
            if token_times is not None:
                ts = list(token_times)
                if ts and start is not None:
                    self.ttft.add(ts[0] - start)
                for a, b in zip(ts, ts[1:]):
                    self.itl.add(b - a)
                return
            if ttft is not None:
                self.ttft.add(ttft)
            if itl is not None:
                for g in itl:
                    self.itl.add(g)
        except Exception:
            pass

    def fields(self):
        """The step record's generation fields."""
        return {"gen_ns": int(self.ns), "gen_requests": self.requests,
                "gen_prompt_tokens": self.prompt_tokens, "gen_output_tokens": self.output_tokens}

    def detail(self):
        """The rollout event's detail: the two sketches."""
        return {"ttft": self.ttft.to_json(), "itl": self.itl.to_json()}


class RolloutBlock:
    """Times a generation phase and hands its Rollout to ``done``."""

    def __init__(self, done, rollout=None):
        self._done = done
        self.rollout = rollout or Rollout()
        self._t = 0

    def __enter__(self):
        self._t = time.perf_counter_ns()
        return self.rollout

    def __exit__(self, *exc):
        try:
            self.rollout.ns += time.perf_counter_ns() - self._t
            self._done(self.rollout)
        except Exception:
            pass
        return False
