"""What each CUDA call the capture makes on the training thread costs here:
µs a call (the median of 20 blocks of 200 calls), beside a tiny kernel's
launch for scale. One JSON object.

    python3 examples/gpu/costs.py
"""

import json
import statistics
import time

import torch


def per_call(fn, n=200, blocks=20):
    for _ in range(n):
        fn()
    out = []
    for _ in range(blocks):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn()
        out.append((time.perf_counter_ns() - t) / n / 1e3)
    return round(statistics.median(out), 3)


def main():
    dev = torch.device("cuda", torch.cuda.current_device())
    idx = dev.index
    x = torch.zeros(8, device=dev)
    torch.cuda.synchronize()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    for e in evs:
        e.record()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    base = torch._C._CudaEventBase.record
    got = {
        "perf_counter_ns": per_call(time.perf_counter_ns),
        "kernel launch (x.add_(1))": per_call(lambda: x.add_(1)),
        "torch.cuda.current_stream(dev)": per_call(lambda: torch.cuda.current_stream(dev)),
        "_cuda_getCurrentStream(idx)": per_call(lambda: torch._C._cuda_getCurrentStream(idx)),
        "Event(enable_timing=True)": per_call(lambda: torch.cuda.Event(enable_timing=True)),
        "event.record() (public)": per_call(lambda: evs[0].record()),
        "event.record(stream)": per_call(lambda: evs[0].record(stream)),
        "_CudaEventBase.record(ev, stream)": per_call(lambda: base(evs[0], stream)),
        "event.query()": per_call(lambda: evs[1].query()),
        "_cuda_memoryStats(idx)": per_call(lambda: torch._C._cuda_memoryStats(idx)),
        "reset_peak_memory_stats(idx)": per_call(lambda: torch.cuda.reset_peak_memory_stats(idx)),
        "_cuda_resetPeakMemoryStats(idx)": per_call(lambda: torch._C._cuda_resetPeakMemoryStats(idx)),
        "max_memory_allocated(idx)": per_call(lambda: torch.cuda.max_memory_allocated(idx)),
    }
    torch.cuda.synchronize()
    evs[0].record()
    evs[1].record()
    torch.cuda.synchronize()
    got["elapsed_time"] = per_call(lambda: evs[0].elapsed_time(evs[1]))
    got["torch"] = torch.__version__
    got["device"] = torch.cuda.get_device_name(idx)
    print(json.dumps(got, indent=1))


if __name__ == "__main__":
    main()
