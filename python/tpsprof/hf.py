"""Hugging Face ``Trainer`` integration: one callback.

    from tpsprof.hf import TpsprofCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TpsprofCallback()])

A thin layer over :mod:`tpsprof.torch`: when training begins it instruments
the Trainer's model, optimizer and training data loader (or, under
``tpsprof launch --auto``, leaves that to the profiler already active), so a
step is one optimizer step of the Trainer (gradient accumulation inside it),
numbered from ``state.global_step`` (a resumed run continues), with
evaluation and checkpoints sent as events between steps (a checkpoint from
the end of the step or evaluation before it to the Trainer's ``on_save``:
the model's safetensors, the optimizer's and the trainer state's files).
What the callback adds from the Trainer's own knowledge:

* tokens as the Trainer counts them for its loss (``num_items_in_batch``):
  ``shift_labels`` other than -100 when the batch has them, else, for a
  model that shifts its labels (causal LMs), ``labels[..., 1:]`` other than
  -100, else the labels, else the attention mask; padded tokens are every
  input position;
* the model's shape (its config, sent as ``hf_config``: the agent reads it
  as ``tpsprof mfu --hf-config`` does) and the training sequence length
  (the first batch's), so the collector computes MFU with nothing declared;
  ``dtype`` from ``bf16``/``fp16`` in the arguments.

Records go to the node's agent (``TPSPROF_SOCKET``, as for
:func:`tpsprof.torch.instrument`); nothing here blocks or raises into
training.
"""

import json
import time

from transformers import TrainerCallback

from . import _tokens, torch as _tt

__all__ = ["TpsprofCallback"]

_CONFIG_BYTES = 32 * 1024  # a meta line is at most 64 KiB


def _shifts_labels(model):
    """Whether model shifts its labels inside its loss (a causal LM: the
    label at position 0 is never a target)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "is_encoder_decoder", False):
        return False
    names = [type(model).__name__] + list(getattr(cfg, "architectures", None) or [])
    return any(n.endswith("ForCausalLM") or n.endswith("LMHeadModel") for n in names)


def _config_dict(model):
    """The model's config as config.json holds it, without what is no shape
    (label maps, nested task settings), or None."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    try:
        d = cfg.to_dict()
    except Exception:
        return None
    out = {}
    for k, v in d.items():
        if v is None or isinstance(v, (bool, int, float, str)):
            out[k] = v
        elif isinstance(v, list) and len(v) <= 1024 and all(isinstance(x, str) for x in v):
            out[k] = v
    if len(json.dumps(out)) > _CONFIG_BYTES:
        return None
    return out


class TpsprofCallback(TrainerCallback):
    """Measures a ``transformers.Trainer`` run with tpsprof.

    tokens: a function of a batch returning its tokens (int, or real and
        padded), instead of the Trainer's own count.
    send_model: send the model's config and sequence length as run
        metadata (for MFU); True by default.
    trace_every, client_options: as for :func:`tpsprof.torch.instrument`.
    """

    def __init__(self, tokens=None, send_model=True, trace_every=None, **client_options):
        self.tokens = tokens
        self.send_model = send_model
        self.trace_every = trace_every
        self.client_options = client_options
        self.prof = None
        self._own = False
        self._shift = False
        self._meta = None  # the metadata to send with the first batch
        self._dtype = None
        self._save_from = None  # wall ns: a checkpoint is due after this step

    # -- the Trainer's events ---------------------------------------------
    def on_train_begin(self, args, state, control, model=None, optimizer=None, train_dataloader=None, **kwargs):
        if self.prof is not None and not self.prof._closed:
            return
        try:
            self._shift = _shifts_labels(model)
            if getattr(args, "bf16", False):
                self._dtype = "bf16"
            elif getattr(args, "fp16", False):
                self._dtype = "fp16"
            cfg = _config_dict(model) if self.send_model else None
            self._meta = {"hf_config": cfg} if cfg else None
            active = _tt.active()
            if active is not None and not active.off:
                # zero-code mode (tpsprof launch --auto) hooks everything
                # already: only the Trainer's token count and metadata
                self.prof, self._own = active, False
                _trainer_steps(active)
                if active.token_fn is None:
                    active.token_fn = self._count
                try:
                    # the Trainer's own loader (accelerate's, which reads the
                    # DataLoader under it a batch ahead) is the one it waits on
                    active.watch_loader(train_dataloader)
                except TypeError:
                    pass  # not a DataLoader: zero-code mode's global hook times it
                return
            inner = getattr(optimizer, "optimizer", None)  # accelerate's AcceleratedOptimizer
            if inner is not None and hasattr(inner, "param_groups"):
                optimizer = inner
            self.prof = _tt.instrument(model, optimizer, train_dataloader, tokens=self._count,
                                       first_step=state.global_step, trace_every=self.trace_every,
                                       **self.client_options)
            self._own = True
            _trainer_steps(self.prof)
        except Exception:
            self.prof = None  # never into training

    def on_step_end(self, args, state, control, **kwargs):
        # The Trainer evaluates and then saves after this event: the save
        # runs from here (or from the evaluation's end) to on_save.
        self._save_from = time.time_ns() if control.should_save and self.prof is not None else None

    def on_evaluate(self, args, state, control, **kwargs):
        if self._save_from is not None:
            self._save_from = time.time_ns()

    def on_save(self, args, state, control, **kwargs):
        start, self._save_from = self._save_from, None
        if start is None or self.prof is None:
            return
        try:
            # merged with the torch.save calls inside it into one event
            self.prof._side_event("checkpoint_save", start, time.time_ns())
        except Exception:
            self.prof._err()

    def on_train_end(self, args, state, control, **kwargs):
        if self.prof is not None and self._own:
            self.prof.close()

    # -- tokens -------------------------------------------------------------
    def _count(self, batch):
        """(real, padded) tokens of one micro-batch, as the Trainer counts
        the items of its loss; sends the metadata with the first batch."""
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        if not _tokens.is_ids(ids):
            ids = None
        if self._meta is not None and ids is not None and ids.dim() == 2:
            meta, self._meta = self._meta, None
            meta["seq"] = int(ids.shape[-1])
            if self._dtype:
                meta["dtype"] = self._dtype
            prof = self.prof
            if prof is not None:
                prof._sender.put(lambda: prof.client.meta(**meta))
        if self.tokens is not None:
            return self.tokens(batch)
        shifted = batch.get("shift_labels") if ids is not None else None
        labels = batch.get("labels") if ids is not None else None
        if shifted is not None:
            return _tokens.sum_later(shifted, -100), ids.numel()
        if labels is not None and labels.shape == ids.shape:
            return _tokens.sum_later(labels[..., 1:] if self._shift else labels, -100), ids.numel()
        got = _tokens.token_counts(batch)  # no input ids or labels: the automatic count
        return None if got is None else got[:2]


def _trainer_steps(prof):
    """Tracker rows at the Trainer's step numbers: it logs a step at its
    global_step after the update, one past tpsprof's (rows sat one step
    behind its train/loss: 0..29 against 1..30)."""
    tr = getattr(getattr(prof, "client", None), "trackers", None)
    if tr is not None:
        tr.step_offset = 1
