"""tpsprof: training throughput measured inside the training process.

Two ways in, both stdlib at their core and neither ever blocking or raising
into the training loop:

* the plain API, steps timed by hand::

      import tpsprof
      prof = tpsprof.Profiler()           # job, rank, world size, attempt from the environment
      for step, batch in enumerate(loader):
          prof.start(step)
          with prof.phase("data_wait"):
              batch = next(it)
          loss = train_step(batch)
          prof.end(tokens=tokens_of_my_replica, loss=float(loss))

* measured, with PyTorch (``tpsprof.torch``): one call hooks the model, the
  optimizer and the data loader, and every step's data wait, forward,
  backward, optimizer, communication and exposed communication, tokens and
  padded tokens are measured without hand timing and without a host
  synchronisation::

      prof = tpsprof.torch.instrument(model, optimizer, loader)

  ``tpsprof launch --auto -- torchrun train.py`` does the same to an
  unmodified script.

In RL post-training, time the step's generation with ``with prof.rollout()
as r:`` and record each request (``r.request(prompt_tokens, output_tokens,
token_times=..., start=...)``): the collector reports generation TPS, time to
first token and inter-token latency beside the update's TPS and MFU.

Records go to the node's tpsprof agent over its unix socket (TPSPROF_SOCKET,
set by ``tpsprof launch``).
"""

from ._client import PHASES, Profiler, TPSProf, default_socket, env_attempt
from ._rollout import Rollout, Sketch

__all__ = ["PHASES", "Profiler", "Rollout", "Sketch", "TPSProf", "default_socket", "env_attempt", "torch"]
__version__ = "0.2.0"


def __getattr__(name):
    # ``tpsprof.torch`` imports PyTorch only when asked for.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'tpsprof' has no attribute %r" % name)
