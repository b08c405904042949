"""The batch component of the in-process profiler: what a step trains on,
counted. The watched loaders' fetches (or the batches a framework hands
over), the watched model's forward inputs where no loader gives them, the
tokens the job declares (add_tokens, add_batch, a tokens= function,
TPSPROF_TOKENS_PER_STEP), a bare id batch split into inputs and targets;
counted on the GPU at once or on the sender's thread from a reference;
and, on the sender's thread, what counted them and what the data wait is,
said in the run metadata when it changes.

It reaches the profiler only through its public seam (``client``,
``cuda``, ``steps``, ``unmeasured(key, why)``) and owns what it keeps:
the token rules, the model whose inputs count, whether the job declared
its own, and what was last said.
"""

import os

import torch

from . import _guard
from ._hooks import host_batch
from ._steps import totals
from ._tokens import Fetch, count_many, counts_now, is_ids, lazy_int

__all__ = ["Batches", "FINGERPRINT_STEPS"]

# The first steps send a fingerprint of their first host batch: the agent
# warns when ranks counted as separate replicas trained on identical ones.
FINGERPRINT_STEPS = 8


def per_step_env() -> int:
    """TPSPROF_TOKENS_PER_STEP as a positive count, else 0 (absent or not
    a positive integer: the package counts tokens itself)."""
    try:
        n = int(os.environ.get("TPSPROF_TOKENS_PER_STEP", "0") or 0)
    except ValueError:
        return 0
    return n if 0 < n <= 1 << 40 else 0


class Batches:
    """The steps' batches (a component of TorchProfiler, ``prof.batches``).
    ``token_fn``: the job's count of a batch (None: the package's rules);
    ``count_fetches``: whether the loaders' fetches count (False where a
    framework hands the batch over: add_batch)."""

    def __init__(self, prof, token_fn, ignore_index, count_fetches):
        self.prof = prof
        self.token_fn = token_fn
        self.ignore_index = ignore_index
        self.count_fetches = count_fetches
        self.model = None  # id of the model whose forward inputs count, without a loader
        self.declared = False  # add_tokens or add_batch used: forward inputs never count
        # TPSPROF_TOKENS_PER_STEP (launch --tokens-per-step): each step's
        # tokens, unless the job's code declares its own
        self.per_step = per_step_env()
        self._token_source = None  # what counted the tokens, as last said
        self._data_source = None  # what the steps' data wait is, as last said
        self._hooks_said = False  # the hooks record goes out with the first step's

    # -- the training thread ------------------------------------------------
    def model_watched(self, model):
        """A watched model: the first one's inputs count without a loader."""
        if self.model is None:
            self.model = id(model)

    def fetched(self, st, batch):
        """batch is trained in step st: its counts, or a reference to count later."""
        if self.token_fn is not None:
            n = self.token_fn(batch)
            real, padded = n if isinstance(n, tuple) else (n, n)
            f = Fetch(None, (lazy_int(real), lazy_int(padded), 0, None) if real is not None else None)
        elif self.prof.cuda and not host_batch(batch):
            # counts on the GPU are launched now, on the training
            # stream, and read once the step is over (a batch still on
            # the host, as loaders give it, is counted as on CPU: below)
            keep = batch.__class__ is torch.Tensor or self.prof.steps < FINGERPRINT_STEPS  # (see FINGERPRINT_STEPS)
            f = Fetch(batch if keep else None, counts_now(batch, self.ignore_index))
        else:
            # on the host the batch is counted when its record is built,
            # on the sender thread: the training thread keeps a reference
            f = Fetch(batch, None)
        st.fetches.append(f)
        if self.token_fn is None and batch.__class__ is torch.Tensor:
            st.bare = f  # maybe split into inputs and targets: see split

    def declare(self, st, batch=None, tokens=None):
        """The job declares step st's batch (add_batch) or its tokens
        (add_tokens): the counts its forwards' inputs gave go, and no
        forward's inputs count from now on."""
        self.declared = st.declared = True
        if st.fwd_fetches:
            drop = set(map(id, st.fwd_fetches))
            st.fetches = [f for f in st.fetches if id(f) not in drop]
            st.fwd_fetches = []
        if tokens is not None:
            st.fetches.append(Fetch(None, (max(int(tokens), 0), 0, 0, None)))
        else:
            self.fetched(st, batch)

    def forward(self, st, module, inputs, kwargs):
        """A training forward of a watched module: a bare batch fetched
        for the step split by its inputs, else the inputs counted where
        nothing else gives the step's tokens."""
        if st.bare is not None:
            self.split(st, inputs)
        elif kwargs is not None:
            self._forward_inputs(st, module, inputs, kwargs)

    def _forward_inputs(self, st, module, inputs, kwargs):
        """A step whose tokens no watched loader gave (nanoGPT's get_batch, a
        loop over tensors): the watched model's forward inputs are its batch,
        counted by the same rules (input_ids or the first integer tensor; the
        mask, the labels, a next-token split), once per forward of the first
        watched model. Never beside a loader's batches, add_tokens or
        add_batch (their counts win), nor with a tokens= function."""
        if self.model is None:
            self.model = id(module)  # zero-code mode: the first root found
        if (not self.count_fetches or self.token_fn is not None or self.declared or self.per_step
                or (st.fetches and not st.fwd_fetches) or id(module) != self.model):
            return
        batch = kwargs if kwargs and ("input_ids" in kwargs or "labels" in kwargs or "attention_mask" in kwargs) else inputs
        if isinstance(batch, tuple) and len(batch) == 1:
            batch = batch[0]
        n = len(st.fetches)
        self.fetched(st, batch)
        st.fwd_fetches.extend(st.fetches[n:])
        st.bare = None  # its own inputs: no split to find

    def split(self, st, inputs):
        """A bare (B, L) id batch whose forward takes (B, L-1) ids: the loop
        split it into inputs and next-token targets; B*(L-1) tokens are
        trained on, not B*L."""
        f, st.bare = st.bare, None
        batch = f.batch
        if f.counts is not None:
            f.batch = None  # counted already: not kept any longer
        if not (is_ids(batch) and batch.dim() == 2):
            return
        b, n = batch.shape
        for a in inputs if isinstance(inputs, (list, tuple)) else (inputs,):
            if isinstance(a, torch.Tensor):
                if is_ids(a) and a.dim() == 2 and a.shape[0] == b and a.shape[1] == n - 1:
                    f.split = b * (n - 1)
                return

    # -- the sender's thread ------------------------------------------------
    def count(self, steps):
        """The token counts of steps about to be sent: their host batches
        counted together (count_many), before each record resolves them."""
        try:
            count_many([f for st in steps for f in st.fetches], self.ignore_index)
        except Exception:
            self.prof.failed()

    def of(self, st):
        """A finished step's batch figures as its record sends them,
        (tokens, padded, samples, seq_sq, fingerprint), what counted them
        and the data wait said."""
        fp = None
        if self.prof.steps < FINGERPRINT_STEPS and st.fetches:
            fp = st.fetches[0].fingerprint()  # before resolve lets the batch go
        tokens, padded, samples, seq_sq = totals([f.resolve(self.ignore_index) for f in st.fetches], st.skipped)
        src = self.source_of(st)
        if src == "per_step" and not st.skipped:
            tokens = padded = self.per_step
        elif tokens == 0 and src in ("loader", "forward"):
            src = "none"  # batches without token ids (features, images)
        self._say_source(src)
        self._say_data(st)
        return tokens, padded, samples, seq_sq, fp

    def source_of(self, st):
        """What counts a step's tokens: a key of the run metadata's
        token_source (tps.TokenSources). The job's own code (a tokens=
        function, add_tokens, add_batch) wins over a count declared at
        launch, which wins over what the package counts (the watched
        loaders' batches, else the model's forward inputs)."""
        if self.token_fn is not None:
            return "function"
        if st.declared:
            return "declared"
        if self.per_step:
            return "per_step"
        if st.fwd_fetches:
            return "forward"
        return "loader" if st.fetches else "none"

    def _say_data(self, st):
        """Rank 0 sends what its steps' data wait is (run metadata
        data_source) when it changes: a timed fetch's wait (a watched
        DataLoader, prof.wrap) or the time before the first forward
        (batches from anything else)."""
        c = self.prof.client
        if c.rank != 0:
            return
        src = "before_forward" if st.pre is not None else ("loader" if st.fetched else None)
        if src is None or src == self._data_source:
            return
        self._data_source = src
        c.meta(data_source=src)

    def _say_source(self, src):
        """Rank 0 sends what counted the tokens in the run metadata when it
        changes (the report says it); "none" only if nothing counted any of
        its first steps. The hooks record first, once (_say_hooks)."""
        self._say_hooks()
        c = self.prof.client
        if c.rank != 0 or src == self._token_source:
            return
        if src == "none" and (self._token_source is not None or self.prof.steps < 3):
            return
        self._token_source = src
        c.meta(token_source=src)

    def _say_hooks(self):
        """(With the first step's record.) Rank 0 sends, once, which hook
        families are live and how (run metadata ``hooks``); in a
        distributed job a communication family that could not be hooked
        goes out as unmeasured with its reason. Not at start-up: the layout
        goes out before every rank's first record, and the collector holds
        a job's first steps until metadata comes; a record of ours that
        came first would end the hold before a pipeline's layout (2
        replicas where the job had 1)."""
        if self._hooks_said:
            return
        self._hooks_said = True
        c = self.prof.client
        why = _guard.off("communication")
        if why and c.world_size > 1:
            self.prof.unmeasured("communication", "no collective hook on torch %s: %s" % (torch.__version__, why))
        hooks = _guard.installed()
        if c.rank == 0:
            # steps="loop": each step runs from the end of the previous one
            # (tps.StepsLoop; the report holds the attempts' time to it)
            if hooks:
                c.meta(hooks={k: v[:100] for k, v in hooks.items()}, steps="loop")
            else:
                c.meta(steps="loop")
