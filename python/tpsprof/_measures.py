"""The step record's measures, as tps.Measures declares them (generated from
tps/measures.go by `go test ./tps -run TestMeasuresPython -update-docs`: do not edit).

MEASURES maps a measure's key to its bounds: ("blocking", None) a part of the
step's wall time (0 to duration_ns), ("phase"|"trace", None) 0 to 24 h,
("own", MAX) 0 to MAX, ("own", None) bounds of its own (client.send_step).
SPLITS maps a measure that splits out a part of the breakdown to that
part's key, its words and its tracker name.
"""

from types import MappingProxyType

MAX_STEP_NS = 86400000000000

MEASURES = MappingProxyType({
    "start_unix_ns": ("own", None),
    "end_unix_ns": ("own", None),
    "duration_ns": ("own", None),
    "tokens": ("own", None),
    "padded_tokens": ("own", None),
    "samples": ("own", None),
    "data_wait_ns": ("blocking", None),
    "fwd_ns": ("phase", None),
    "bwd_ns": ("phase", None),
    "optim_ns": ("phase", None),
    "comm_ns": ("phase", None),
    "exposed_comm_ns": ("blocking", None),
    "pp_wait_ns": ("blocking", None),
    "ckpt_ns": ("blocking", None),
    "trace_compute_ns": ("trace", None),
    "trace_comm_ns": ("trace", None),
    "trace_exposed_comm_ns": ("trace", None),
    "seq_sq_sum": ("own", None),
    "bytes": ("own", None),
    "gen_ns": ("own", None),
    "gen_requests": ("own", None),
    "gen_prompt_tokens": ("own", None),
    "gen_output_tokens": ("own", None),
    "capture_ns": ("phase", None),
    "capture_cpu_ns": ("phase", None),
    "mem_peak_allocated_bytes": ("own", 1125899906842624),
    "mem_peak_reserved_bytes": ("own", 1125899906842624),
    "mem_capacity_bytes": ("own", 1125899906842624),
    "gc_ns": ("phase", None),
    "host_ns": ("blocking", None),
    "capture_comm_ns": ("phase", None),
    "capture_comm_cpu_ns": ("phase", None),
})

SPLITS = MappingProxyType({
    "gc_ns": ("compute", "Python GC", "split/gc"),
    "host_ns": ("host_other", "host work before the forward", "split/host"),
})
