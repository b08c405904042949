"""Tokens of a batch: what a training step trained on, counted from its tensors.

Used by tpsprof.torch's hooks (and the Hugging Face callback). On the host a
count is made when the step's record is built, on the sender thread (the
training thread keeps a reference to the batch); on a GPU the reduction is
launched on the training stream at the fetch and its result copied to pinned
host memory, read once the step is over. docs/capture.md says what counts as
a token.
"""

import zlib
from typing import Any, Optional, Tuple, Union

import torch

__all__ = ["count_tokens", "packed_seq_sq", "token_counts", "packed_sq", "is_ids", "Fetch", "counts_now",
           "CountLater", "sum_later", "lazy_int", "as_int", "count_many"]

Count = Union[int, torch.Tensor, "CountLater"]


def is_ids(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex() \
        and t.dtype != torch.bool and t.dim() >= 1


def count_tokens(batch: Any, ignore_index: int = -100) -> Optional[Tuple[Count, int, int]]:
    """(real, padded, samples) of a batch, or None when it holds no tokens
    (see token_counts; counts on a GPU stay GPU tensors)."""
    got = token_counts(batch, ignore_index)
    if got is None:
        return None
    real, padded, samples = got
    return (int(real) if isinstance(real, CountLater) else real), padded, samples


def token_counts(batch: Any, ignore_index: int = -100) -> Optional[Tuple[Count, int, int]]:
    """(real, padded, samples) of a batch, or None when it holds no tokens.

    Real tokens are the attention mask's sum when the batch has one, else
    the labels other than ``ignore_index``, else every input id; padded
    tokens are every position. Counts of tensors on a GPU stay on the GPU
    (read later, without a synchronisation)."""
    ids = mask = labels = None
    if isinstance(batch, torch.Tensor):
        ids = batch
    elif hasattr(batch, "keys") and hasattr(batch, "get"):
        ids, mask, labels = batch.get("input_ids"), batch.get("attention_mask"), batch.get("labels")
    elif isinstance(batch, (list, tuple)) and batch:
        tensors = [t for t in batch if is_ids(t)]
        if tensors:
            ids = tensors[0]
            if len(tensors) > 1 and tensors[1].shape == ids.shape:
                labels = tensors[1]
    if not is_ids(ids):
        ids = None
    if mask is not None and isinstance(mask, torch.Tensor):
        padded = mask.numel()
        return sum_later(mask), padded, mask.shape[0] if mask.dim() > 1 else 1
    if ids is None:
        return None
    padded = ids.numel()
    samples = ids.shape[0] if ids.dim() > 1 else 1
    if labels is not None and isinstance(labels, torch.Tensor) and labels.numel() == padded:
        return sum_later(labels, ignore_index), padded, samples
    return padded, padded, samples


def packed_seq_sq(batch: Any) -> Optional[Count]:
    """Σ document length² of a packed batch (see packed_sq), or None."""
    v = packed_sq(batch)
    return int(v) if isinstance(v, CountLater) else v


def packed_sq(batch: Any) -> Optional[Count]:
    """Σ document length² of a packed batch, or None for an unpacked one.

    A batch is packed when it carries ``cu_seqlens`` (cumulative document
    lengths, as flash-attention's varlen kernels take them) or
    ``position_ids`` that restart at 0 inside a row (documents
    concatenated). Stays on the GPU when the tensors are there."""
    if not (hasattr(batch, "keys") and hasattr(batch, "get")):
        return None
    cu = batch.get("cu_seqlens")
    if isinstance(cu, torch.Tensor) and cu.dim() == 1 and cu.numel() >= 2 and not cu.is_floating_point():
        lens = (cu[1:] - cu[:-1]).to(torch.int64)
        return sum_later(lens * lens)
    pos = batch.get("position_ids")
    if not is_ids(pos) or pos.shape[-1] < 2:
        return None
    rows = pos.reshape(-1, pos.shape[-1]).to(torch.int64)
    starts = rows == 0
    starts[:, 0] = True
    if int(starts.sum()) == rows.shape[0]:
        return None  # one document per row: not packed
    # each document's length is the position just before the next start (+1)
    ends = torch.zeros_like(starts)
    ends[:, :-1] = starts[:, 1:]
    ends[:, -1] = True
    lens = rows[ends] + 1
    return sum_later(lens * lens)


class Fetch:
    """One batch of a step: its counts (real tokens, padded tokens, samples,
    Σ document length² or None), made as it was fetched (a GPU batch's stay
    on the GPU until read) or, for a host batch, when the record is built;
    ``split`` replaces both token counts when the loop split a bare id batch
    into inputs and next-token targets."""

    __slots__ = ("batch", "counts", "split")

    def __init__(self, batch, counts):
        self.batch, self.counts, self.split = batch, counts, None

    def fingerprint(self) -> Optional[str]:
        """(On the sender thread, before resolve.) A fingerprint of a host
        batch's token ids (CRC-32 of their first 4 KiB and their shape), or
        None (a GPU batch is not read: that would wait for the GPU)."""
        ids = _ids_of(self.batch)
        if ids is None or ids.device.type != "cpu":
            return None
        try:
            flat = ids.detach().reshape(-1)[:4096 // max(ids.element_size(), 1)].contiguous()
            crc = zlib.crc32(flat.numpy().tobytes())
            return "%08x-%s" % (crc, "x".join(str(d) for d in ids.shape))
        except Exception:
            return None

    def resolve(self, ignore_index: int) -> tuple:
        """(On the sender thread.) The counts as ints; the batch let go."""
        c = self.counts
        if c is None and self.batch is not None:
            c = counts_now(self.batch, ignore_index)
        self.batch = None
        if c is None:
            return 0, 0, 0, False  # no tokens in it
        real, padded, samples, sq = c
        if self.split is not None:
            real = padded = self.split
        return as_int(real), as_int(padded), samples, None if sq is None else as_int(sq)


def _ids_of(batch: Any) -> Optional[torch.Tensor]:
    """The token ids of a batch (as token_counts finds them), or None."""
    ids = None
    if isinstance(batch, torch.Tensor):
        ids = batch
    elif hasattr(batch, "keys") and hasattr(batch, "get"):
        ids = batch.get("input_ids")
    elif isinstance(batch, (list, tuple)) and batch:
        ids = next((t for t in batch if is_ids(t)), None)
    return ids if is_ids(ids) else None


def counts_now(batch: Any, ignore_index: int) -> Optional[tuple]:
    """The Fetch counts of a batch (None: it holds no tokens)."""
    got = token_counts(batch, ignore_index)
    if got is None:
        return None
    real, padded, samples = got
    sq = packed_sq(batch)
    return lazy_int(real), lazy_int(padded), samples, None if sq is None else lazy_int(sq)


class CountLater:
    """Tokens of a CPU tensor counted when the record is built, on the
    sender thread: the mask's sum, or the labels other than the ignore
    index (the training thread keeps a reference, not a reduction)."""

    __slots__ = ("t", "ignore", "n")

    def __init__(self, t, ignore=None):
        self.t, self.ignore, self.n = t, ignore, None

    def __int__(self):
        if self.n is not None:
            return self.n
        t = self.t
        if self.ignore is None:
            return int(t.sum())
        return int(torch.count_nonzero(t.ne(self.ignore)))


def count_many(fetches, ignore_index: int) -> None:
    """(On the sender thread, before the fetches resolve.) Counts the host
    batches of many steps at once: the counts of tensors of one shape, dtype
    and ignore index by one reduction over them stacked. Counted one at a
    time between the records' other work, each count ran cold (43-62 us of
    a near-empty step's 88-118 us record on this machine; 6-7 us a count in
    a run of them: BENCHMARKS.md)."""
    groups = {}
    for f in fetches:
        if f.counts is None and f.batch is not None:
            f.counts = counts_now(f.batch, ignore_index)
        for c in f.counts or ():
            if c.__class__ is CountLater and c.n is None:
                t = c.t
                groups.setdefault((t.dtype, tuple(t.shape), c.ignore), []).append(c)
    for (_, _, ignore), cs in groups.items():
        if len(cs) < 2:
            continue  # counted by int() as it resolves
        s = torch.stack([c.t for c in cs]).reshape(len(cs), -1)
        if ignore is not None:
            s = s.ne(ignore)
        for c, v in zip(cs, s.sum(1).tolist()):
            c.n, c.t = int(v), None


def sum_later(t: torch.Tensor, ignore: Optional[int] = None) -> Count:
    if t.device.type == "cpu":
        return CountLater(t, ignore)
    s = (t if ignore is None else (t != ignore)).sum()
    return s


def lazy_int(v: Any) -> Count:
    """An int now, or a pinned host copy of a GPU scalar read after the step,
    or a CPU count made when the record is built."""
    if isinstance(v, CountLater):
        return v
    if not isinstance(v, torch.Tensor):
        return int(v)
    if v.device.type == "cpu":
        return int(v)
    try:
        buf = torch.empty((), dtype=v.dtype, pin_memory=True)
        buf.copy_(v, non_blocking=True)
        return buf
    except Exception:
        return 0


def as_int(v: Any) -> Any:
    return int(v) if isinstance(v, (torch.Tensor, CountLater)) else v
