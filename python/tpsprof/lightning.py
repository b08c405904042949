"""Lightning integration: one callback.

    from tpsprof.lightning import TpsprofCallback
    trainer = lightning.Trainer(..., callbacks=[TpsprofCallback()])

Works with ``lightning`` (``lightning.pytorch``) and with the older
``pytorch_lightning`` package, whichever the job imports. A thin layer over
:mod:`tpsprof.torch`: when training starts it watches the LightningModule
(forward and backward), every optimizer of the Trainer (the last optimizer
step of an iteration ends the step; gradient accumulation stays inside it)
and the training data loaders (time blocked in ``next``), or, under
``tpsprof launch --auto``, uses the profiler zero-code mode made. What the
callback adds from the Trainer's own knowledge:

* **tokens of the batch each step trains**, handed over by
  ``on_train_batch_start`` (Lightning's fetcher reads a batch ahead for
  loaders without a length, so the batch fetched during a step is not
  always the one it trains): the automatic count (attention mask, labels
  other than ``ignore_index``, input ids) or ``tokens=``;
* the forward as Lightning runs it: ``training_step`` (which calls the
  model's modules; Lightning never calls the LightningModule itself on one
  device) is timed as fwd, its loss's backward as bwd;
* step numbers from ``trainer.global_step`` (a resumed fit continues);
* checkpoints: ``trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls)
  is a ``checkpoint_save`` event between steps, the file write included;
  validation during training (``on_validation_start`` to ``_end``) an
  ``eval`` event.

Lightning runs a training step inside ``optimizer.step(closure)``: forward
and backward count as fwd and bwd, the update after the closure as optim.
The loss recorded is the one whose backward ran (under gradient
accumulation Lightning divides it by the number of micro-batches first).
A bare id batch split into inputs and targets inside ``training_step`` is
counted whole: give ``tokens=`` for it.

Records go to the node's agent (``TPSPROF_SOCKET``, as for
:func:`tpsprof.torch.instrument`); nothing here blocks or raises into
training.
"""

import time
from typing import Any, Callable, Optional

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback

import torch

from . import _c10d, _patches, torch as _tt

__all__ = ["TpsprofCallback"]


class TpsprofCallback(Callback):
    """Measures a Lightning ``Trainer.fit`` with tpsprof.

    tokens: a function of a batch returning its tokens (int, or real and
        padded), instead of the automatic count.
    ignore_index, trace_every, client_options: as for
        :func:`tpsprof.torch.instrument`.
    """

    def __init__(self, tokens: Optional[Callable[[Any], Any]] = None, ignore_index: int = -100,
                 trace_every: Optional[int] = None, **client_options: Any) -> None:
        self.tokens = tokens
        self.ignore_index = ignore_index
        self.trace_every = trace_every
        self.client_options = client_options
        self.prof: Optional[_tt.TorchProfiler] = None
        self._own = False
        self._undo = []  # (object, attribute) set on the job's objects, taken off at the end
        self._val_start = None  # wall ns: validation began

    # -- the Trainer's events ---------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.prof is not None and not self.prof._closed:
            return
        try:
            optimizers = list(getattr(trainer, "optimizers", None) or [])
            active = _tt.active()
            if active is not None and not active.off:
                # zero-code mode (tpsprof launch --auto) hooks the model and
                # the optimizers already
                self.prof, self._own = active, False
                if self.tokens is not None and active.token_fn is None:
                    active.token_fn = self.tokens
                active.watch_optimizer(optimizers)
                roots = active.root_finder
                if roots is not None:
                    roots.stop()  # its forward is training_step, timed here
                self._time_training_step(pl_module)
            else:
                self.prof = _tt.TorchProfiler(tokens=self.tokens, ignore_index=self.ignore_index,
                                              first_step=int(trainer.global_step), trace_every=self.trace_every,
                                              count_fetches=False, **self.client_options)
                self._own = True
                self.prof._set_device_from(pl_module)
                self.prof.watch_optimizer(optimizers)
                self._time_training_step(pl_module)
            # this step's batch comes from on_train_batch_start, not from the fetch
            self.prof.count_fetches(False)
            self._watch_loaders(trainer)
            self._watch_saves(trainer)
        except Exception:
            if self.prof is not None and self._own:
                self.prof.close(timeout=0)
            self.prof = None  # never into training

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        prof = self.prof
        if prof is not None:
            prof.add_batch(batch)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        prof = self.prof
        if prof is None or getattr(trainer, "sanity_checking", False):
            return
        try:
            prof._settle_step()  # the training step before it is over
            self._val_start = time.time_ns()
        except Exception:
            prof._err()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        start, self._val_start = self._val_start, None
        prof = self.prof
        if prof is None or start is None:
            return
        try:
            st = prof._cur
            if st is not None and not st.trained:
                prof._discard()  # opened by validation's fetches (zero-code mode times every loader)
            prof._side_event("eval", start, time.time_ns())
        except Exception:
            prof._err()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for obj, name in self._undo:
            try:
                del obj.__dict__[name]  # the class's own again
            except Exception:
                pass
        self._undo = []
        if self.prof is not None and self._own:
            self.prof.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.on_train_end(trainer, pl_module)

    # -- what the callback hooks ---------------------------------------------
    def _watch_loaders(self, trainer: Any) -> None:
        """Times ``next`` of the training loaders: their class is swapped for
        the iterators of later epochs, and the iterators Lightning made for
        this one before training started (its fit loop makes them before
        ``on_train_start``) are wrapped where they are kept."""
        prof = self.prof
        combined = getattr(getattr(trainer, "fit_loop", None), "_combined_loader", None)
        loaders = getattr(combined, "flattened", None)
        if loaders is None:
            got = getattr(trainer, "train_dataloader", None)
            loaders = [got] if got is not None else []
        for dl in loaders:
            if isinstance(dl, torch.utils.data.DataLoader):
                prof.watch_loader(dl)
        it = getattr(combined, "_iterator", None)
        iterators = getattr(it, "iterators", None)
        iterables = getattr(it, "iterables", None)
        if not isinstance(iterators, list) or iterables is None:
            return
        for i, (inner, dl) in enumerate(zip(list(iterators), iterables)):
            if isinstance(dl, torch.utils.data.DataLoader) and not isinstance(inner, _patches.LoaderIter):
                iterators[i] = _patches.LoaderIter(None, inner)

    def _watch_saves(self, trainer: Any) -> None:
        """``trainer.save_checkpoint`` (ModelCheckpoint's way in) as a
        checkpoint event, on this Trainer only."""
        fn = getattr(trainer, "save_checkpoint", None)
        if fn is None or getattr(fn, "_tpsprof", False):
            return
        trainer.save_checkpoint = _patches.side_call("checkpoint_save", fn)
        self._undo.append((trainer, "save_checkpoint"))

    def _time_training_step(self, pl_module: Any) -> None:
        """``training_step`` timed as the forward, on this module only."""
        inner = pl_module.training_step
        if getattr(inner, "_tpsprof", False):
            return
        prof = self.prof

        def training_step(*args: Any, **kwargs: Any) -> Any:
            prof._fwd_pre(pl_module, args)
            out = inner(*args, **kwargs)
            prof._fwd_post(pl_module, args, out)
            return out
        training_step._tpsprof = True
        _c10d.skip_dynamo(training_step)
        object.__setattr__(pl_module, "training_step", training_step)
        self._undo.append((pl_module, "training_step"))
