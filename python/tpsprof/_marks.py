"""The seam between the profiler and the code that calls into it.

The patches (``_patches``, ``_c10d``), the framework callbacks (``hf``,
``lightning``), zero-code mode (``_auto``) and the sender thread
(``_sender``) reach the active profiler only through the marks and the
state named here; ``tpsprof.torch.TorchProfiler`` implements ``Marks``
(the loop's marks in its base, ``tpsprof._loop.Loop``).
``tests/test_marks.py`` reads those modules and fails on a reach that is
not named here, so the seam cannot grow unseen.

Every mark runs on the thread that called it and never raises into the
training process: a failure is counted (``_err``).
"""


class Marks:
    """What is marked on the profiler from outside it, and by whom."""

    # -- the forward, backward and loss (the forward wrapper, Tensor.backward,
    #    the framework callbacks, zero-code mode)
    def _fwd_pre(self, module, inputs, kwargs=None):
        """A watched model's forward begins."""
        raise NotImplementedError

    def _fwd_post(self, module, inputs, output):
        """It ends (output: what it returned)."""
        raise NotImplementedError

    def _backward(self, inner, t, args, kwargs):
        """``t.backward(*args, **kwargs)`` through inner, timed."""
        raise NotImplementedError

    # -- data (loaders watched through their iterators)
    def _data_enter(self, src=None):
        """A fetch of the next batch begins."""
        raise NotImplementedError

    def _data_exit(self, opened, dt, batch):
        """It returned batch after dt seconds."""
        raise NotImplementedError

    def _data_end(self, opened):
        """The loader is exhausted."""
        raise NotImplementedError

    # -- communication: the profiler's component ``comm`` (tpsprof._comm.Comm:
    #    its marks now, issue, started, track, begin, end, p2p_blocked,
    #    work_waited, functional_issued/works/waited), named in STATE

    # -- steps, side events and the profiler's life
    def _settle_step(self):
        """The next iteration's first activity: end a stepped iteration."""
        raise NotImplementedError

    def _discard(self):
        """Drop the open step (it was not training's)."""
        raise NotImplementedError

    def _finish(self):
        """End the open step now."""
        raise NotImplementedError

    def _side_event(self, kind, start, end):
        """A checkpoint or evaluation between start and end (wall ns)."""
        raise NotImplementedError

    def _unwatch_model(self, model):
        """Take the hooks off a model about to be compiled."""
        raise NotImplementedError

    def _set_device_from(self, model):
        """The device the steps are timed on, from the model."""
        raise NotImplementedError

    def _err(self):
        """Count a failure of the profiler's own (past a bound it stops)."""
        raise NotImplementedError


# The profiler's state the same modules read, each with its owner (they
# write none of it: what they tell the profiler goes through its public
# methods, note_recompute, note_pipeline_stage, count_fetches, on_step_end,
# root_finder; MarksTest.test_no_private_writes):
STATE = {
    "_tls": "per-thread guards of the patches (re-entry, the step's context)",
    "_cur": "the open step",
    "_closed": "closed: the callbacks stop marking",
    "_scaled": "a grad scaler's scaled losses and their scales (the loss patch)",
    "_watched_loaders": "loaders watched through their class's iterator",
    "_optimizers": "the watched optimizers (zero-code mode's model choice)",
    "_sender": "the sender thread (the HF callback's metadata)",
}
# (public state the callers reach: ``comm``, the communication component,
# whose marks the collective wrappers and dispatcher kernels call; ``off``,
# ``cuda``)
