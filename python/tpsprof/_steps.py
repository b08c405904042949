"""The torch-free core of tpsprof.torch: one training step's marks and the
record they make.

The hooks in tpsprof.torch only take marks (host nanoseconds, or CUDA
events on a GPU) and keep references; everything a record needs from them
is computed here, on the sender thread, from plain numbers: the phases
(summed per kind), communication and its exposed part (docs/capture.md),
and the batch totals. No PyTorch is imported, so the arithmetic is tested
by itself (python/tests/test_steps.py), as Lightning keeps its
``Throughput`` apart from its callback.
"""

from ._intervals import clip, exposed, intersect, length, subtract

__all__ = ["Step", "phases", "totals", "mean_loss"]


class Step:
    """One training step being measured. Marks are whatever the clock of
    the hooks gives (host ns, or CUDA events); intervals are [start, end]
    pairs of marks; an end of None is a span still open."""

    __slots__ = ("number", "t0", "wall0", "end", "data_wait", "fetches", "fwd", "bwd",
                 "loss", "optim", "comm", "blocked", "pp_wait", "fwd_open", "optim_open", "trained", "cuda", "rollout",
                 "bytes", "optimized", "end_at", "bwd_done", "tail", "skipped", "losses", "gap", "bare", "closure",
                 "fwd_fetches", "declared", "own", "own_comm", "mem", "counter", "uncounted", "src", "chained", "pre",
                 "fetched", "end_shared", "flops", "gc", "cpu0", "cpu_end", "pre_cpu", "pre_own", "bwd_open")

    def __init__(self, t0, wall0, cuda=False):
        self.cuda = cuda  # its marks are CUDA events
        self.number = None
        self.t0, self.wall0, self.end = t0, wall0, None
        self.data_wait = 0
        self.fetches = []  # one entry a batch (and one for each add_tokens): see totals
        self.fwd, self.bwd, self.loss, self.optim = [], [], [], []
        self.comm = []  # [start, end] lists; end None while in flight (set from other threads)
        self.blocked = []
        self.pp_wait = []  # host blocked waiting for a point-to-point receive
        self.fwd_open = self.optim_open = None
        self.trained = False
        self.rollout = None  # the generation phase (prof.rollout())
        self.bytes = 0  # text behind the tokens (prof.add_bytes())
        # an optimizer has stepped: the iteration ends at the last optimizer
        # step before the next iteration's first activity (end_at)
        self.optimized = False
        self.end_at = None
        self.bwd_done = False  # a backward pass has completed
        # a backward pass has begun (its start) and autograd's callback for
        # its end is queued: another watched output's gradient in the same
        # backward (zero-code mode watches the loss module's output too)
        # starts nothing more
        self.bwd_open = None
        self.tail = []  # fetches since the last backward: (mark, wall, dt, index in fetches)
        self.skipped = False  # the iteration ended without an optimizer step
        self.own = 0  # ns the training thread spent in tpsprof's hooks during the step
        self.own_comm = 0  # of it, the communication component's marks
        self.mem = None  # (peak allocated, peak reserved, capacity) bytes: CUDA only
        self.counter = None  # PyTorch's FlopCounterMode while the step's FLOPs are counted
        self.uncounted = None  # operators whose FLOP formula raised in the count (then none is sent)
        self.src = None  # the iterator whose fetch opened the step
        self.losses = []  # the losses whose backward ran (one-element values)
        self.gap = 0  # ns of checkpointing inside the step before its training: not the step's
        self.bare = None  # the fetch of a bare (B, L) id batch, until its forward
        # fetches counted from the watched model's forward inputs (no loader
        # batch in the step): dropped if the step's tokens come another way
        self.fwd_fetches = []
        self.declared = False  # add_tokens or add_batch gave its tokens
        self.closure = False  # forward and backward ran inside optimizer.step (a closure)
        # the step begins where the rank's previous step ended (the loop's
        # period: docs/capture.md), not at its own first hooked activity
        self.chained = False
        self.fetched = False  # a timed fetch (a watched loader, prof.wrap) ran in the step
        # (start, end) marks of the time before the step's first forward
        # when no timed fetch gave its batch (get_batch from a token array):
        # the step's data wait
        self.pre = None
        # (CPU) the thread's CPU clock at the step's start (the previous
        # step's end), at its end, and its CPU time in pre: host work
        self.cpu0 = self.cpu_end = self.pre_cpu = self.pre_own = None
        self.end_shared = False  # its end mark is the next step's start (CUDA: not released with it)
        self.flops = None  # the FLOPs its counter counted (popped at its first optimizer step)
        self.gc = None  # the collector's pauses on the training thread in it: (start, end) host ns


def phases(dur, data_wait, fwd, bwd, loss, optim, comm=(), blocked=(), pp_wait=(), gc=()):
    """The phases (ns) of a step of ``dur`` ns from its intervals (ns from
    the step's start; those outside [0, dur] are cut to it).

    Phases of one kind never overlap on the host's timeline, so each is a
    sum, less the time blocked on collectives inside it (``blocked``). Communication is the union of the collectives' spans less the
    time blocked for another pipeline stage (which is ``pp_wait``, not
    communication); its exposed part is what no forward, loss, backward or
    optimizer interval hides, time blocked inside them hiding nothing.
    ``gc`` are the garbage collector's pauses on the training thread (host
    marks: CPU steps): their time is ``gc``, and no phase's own time."""
    fwd, bwd, loss, optim = clip(fwd, 0, dur), clip(bwd, 0, dur), clip(loss, 0, dur), clip(optim, 0, dur)
    pauses = clip(gc, 0, dur)
    blk = clip(blocked, 0, dur) + pauses

    def own(ivs):
        # a phase's own time: less the time blocked inside it on a
        # collective (FSDP2's all-gathers wait inside forward and backward:
        # a rank waiting there for a late peer read as a slow forward, and
        # its host time as that much less)
        return _total(ivs) - length(intersect(ivs, blk)) if blk else _total(ivs)

    out = {"data_wait": data_wait, "fwd": own(fwd), "bwd": own(bwd), "optim": own(optim)}
    if pauses:
        out["gc"] = length(pauses)
    pp = clip(pp_wait, 0, dur)
    if pp:
        out["pp_wait"] = length(pp)
    if comm:
        out["comm"], out["exposed_comm"] = exposed(subtract(clip(comm, 0, dur), pp), fwd + loss + bwd + optim,
                                                   clip(blocked, 0, dur) + pp)
    return out


def totals(counts, skipped=False):
    """(tokens, padded, samples, seq_sq) of a step from its batches' counts,
    each (real tokens, padded tokens, samples, Σ document length²) with the
    last None for an unpacked batch and False for a batch without tokens
    (it has no say in whether the step is packed). seq_sq is None unless
    every batch with tokens is packed; a skipped step trained on no tokens."""
    tokens = padded = samples = seq_sq = 0
    packed = None
    for real, pad, smp, sq in counts:
        tokens += real
        padded += pad
        samples += smp
        if sq is not False:
            packed = sq is not None and packed is not False
            seq_sq += sq or 0
    if not packed:
        seq_sq = None
    if skipped:
        tokens = padded = 0
    return tokens, padded, samples, seq_sq


def mean_loss(values):
    """The mean of the losses whose backward ran in a step, or None."""
    if not values:
        return None
    try:
        vals = [float(x) for x in values]
    except (TypeError, ValueError, RuntimeError):
        return None
    return sum(vals) / len(vals)


def _total(intervals):
    return sum(b - a for a, b in intervals)
