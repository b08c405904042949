"""The process's active profiler: the one slot tpsprof.torch sets (a
profiler made, closed) and the patches, zero-code mode and callbacks read at
each call. Each module imports this one, not tpsprof.torch: no import
cycle. A torch.profiler-like session is the process's, so is this slot."""

profiler = None
