"""The steps' clock, a component of the in-process profiler (``prof.clock``).

A mark is host nanoseconds on CPU (``time.perf_counter_ns`` itself, no call
of ours) and a CUDA event recorded on the current stream on a GPU, read a
few steps later when the event is done (no host synchronisation added to
the loop; docs/capture.md). The clock owns the pool of CUDA events the
sender hands back once a step is sent, and the current stream's object.
It reaches the profiler not at all: the profiler asks it for its mark
function when the device becomes known (``use``).
"""

import time

import torch

__all__ = ["Clock"]

# The C calls behind torch.cuda.current_stream() and Event.record(): a
# (stream id, device index, device type) tuple since torch 2. Module
# globals: the tests replace them with fakes.
_CURRENT_STREAM = getattr(torch._C, "_cuda_getCurrentStream", None)
_CURRENT_DEVICE = getattr(torch._C, "_cuda_getDevice", None)
_EVENT_RECORD = getattr(getattr(torch._C, "_CudaEventBase", None), "record", None)
if _CURRENT_DEVICE is None:
    _CURRENT_STREAM = None

MAX_POOLED = 4096  # CUDA events kept for reuse


class Clock:
    """Marks on the device the loop trains on (``use``); ``mark`` is the
    function that takes one."""

    def __init__(self):
        self.device = None
        self.cuda = False
        self.mark = time.perf_counter_ns
        # on a GPU, how marks are recorded: "direct" (the C calls),
        # "public" (torch.cuda's Python API), said in the run's metadata
        self.calls = None
        self._events = []  # free CUDA events
        self._idx = None
        self._stream = None  # the current stream's key and Stream object
        self._direct = False

    def use(self, device):
        """The device the loop trains on (None: unknown, host marks)."""
        self.device = device
        self.cuda = device is not None and device.type == "cuda"
        if not self.cuda:
            self.mark = time.perf_counter_ns
            return
        self._idx = device.index
        self._stream = None
        self._direct = _EVENT_RECORD is not None and _CURRENT_STREAM is not None
        self.calls = "direct" if self._direct else "public"
        self.mark = self._cuda_mark

    def _cuda_mark(self):
        """A CUDA event recorded on the current stream: the C calls that
        torch.cuda.current_stream() and Event.record() make, less their
        Python (device lookup, a Stream object a call: 7 marks a step made
        them a large part of the training thread's cost on an H100). The
        Stream object is kept while the current stream stays the same. A
        torch whose calls differ gets the public ones from then on."""
        ev = self._events.pop() if self._events else torch.cuda.Event(enable_timing=True)
        if self._direct:
            try:
                idx = self._idx
                key = _CURRENT_STREAM(idx if idx is not None else _CURRENT_DEVICE())
                known = self._stream  # (key, Stream): one object, as threads mark too (autograd's)
                if known is None or known[0] != key:
                    known = self._stream = (key, torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                                                   device_type=key[2]))
                _EVENT_RECORD(ev, known[1])
                return ev
            except Exception:
                self._direct = False
                self.calls = "public (the direct calls failed)"
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def recycle(self, events):
        """(Sender thread.) A sent step's CUDA events back to the pool."""
        seen = set()
        for ev in events:
            if id(ev) not in seen and len(self._events) < MAX_POOLED:
                seen.add(id(ev))
                self._events.append(ev)
