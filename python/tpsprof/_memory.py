"""The memory component of the in-process profiler: the CUDA caching
allocator's peaks of each step (or every TPSPROF_MEMORY_EVERY steps) and
the device's capacity, read on the training thread where a step finishes
(host-side counters: no synchronisation); TPSPROF_MEMORY=0 leaves the
allocator alone. It keeps its own state and needs the profiler for
nothing but the device."""

import os

import torch

__all__ = ["MemoryPeaks"]


def _env_int(name, default, least):
    try:
        return max(int(os.environ.get(name, "") or default), least)
    except ValueError:
        return default


class MemoryPeaks:
    """The steps' allocator peaks (a component of TorchProfiler,
    ``prof.memory``)."""

    def __init__(self):
        self.on = os.environ.get("TPSPROF_MEMORY", "1") != "0"
        # TPSPROF_MEMORY_EVERY=n: the allocator's peak read every n steps (the
        # peak of the n steps, on the n-th's row); reading it is the largest
        # single cost of a step on CUDA after the marks
        self.every = _env_int("TPSPROF_MEMORY_EVERY", 1, 1)
        self._left = 0
        self._cap = None

    def step_finished(self, device):
        """(Training thread, a CUDA step finishing.) The peaks since the
        last reading and the capacity, (allocated, reserved, capacity)
        bytes, where this step reads them; else None."""
        if not self.on:
            return None
        out = None
        if self._left <= 0:
            out = self.read(device)
            self._left = self.every
        self._left -= 1
        return out

    def read(self, device):
        """The caching allocator's peaks since the last reading and the
        device's capacity, then the peaks reset (as torchtitan's memory
        monitor does each step). The allocator's raw statistics, not
        torch.cuda.memory_stats(), whose flattening of ~100 entries costs
        more than the rest."""
        try:
            idx = device.index if device is not None and device.index is not None else torch.cuda.current_device()
            raw = getattr(torch._C, "_cuda_memoryStats", None)
            if raw is not None:
                stats = raw(idx)
                alloc = stats["allocated_bytes"]["all"]["peak"]
                resv = stats["reserved_bytes"]["all"]["peak"]
            else:
                alloc, resv = torch.cuda.max_memory_allocated(idx), torch.cuda.max_memory_reserved(idx)
            torch.cuda.reset_peak_memory_stats(idx)
            if self._cap is None:
                self._cap = int(torch.cuda.get_device_properties(idx).total_memory)
            return int(alloc), int(resv), self._cap
        except Exception:
            self.on = False  # an allocator without these statistics: not asked again
            return None
