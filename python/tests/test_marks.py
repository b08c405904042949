"""The seam between the profiler and its callers (tpsprof/_marks.py): every
reach of the patches, callbacks, zero-code mode and the sender thread into
the profiler is a mark or a piece of state the seam names, and the profiler
implements every mark."""

import os
import re
import unittest

from tpsprof import _marks
import tpsprof.torch as tt

_CALLERS = ("_patches.py", "_c10d.py", "hf.py", "lightning.py", "_auto.py", "_rollout.py", "_trackers.py", "_sender.py")
_COMPONENTS = ("_comm.py", "_flops.py", "_capture.py", "_batches.py", "_records.py", "_memory.py", "_topology.py",
               "_hooks.py", "_clock.py", "_cost.py")
# PyTorch's own private state, written on purpose: a tensor's hook dict
# (_hooks.grad_hook: register_hook at half its cost)
_TORCH_PRIVATE = {"_backward_hooks"}
_REACH = re.compile(r"\b(?:prof|p|profiler|_active\.profiler|self\._prof|self\.prof)\.(_[A-Za-z0-9_]+)")


class MarksTest(unittest.TestCase):
    def test_every_reach_is_named(self):
        marks = {n for n in vars(_marks.Marks) if n.startswith("_") and not n.startswith("__")}
        here = os.path.join(os.path.dirname(_marks.__file__))
        seen = set()
        for name in _CALLERS:
            with open(os.path.join(here, name)) as f:
                for m in _REACH.finditer(f.read()):
                    seen.add(m.group(1))
                    self.assertTrue(m.group(1) in marks or m.group(1) in _marks.STATE,
                                    "%s reaches the profiler's %s, which the seam does not name" % (name, m.group(1)))
        self.assertGreater(len(seen), 15)  # the pattern still finds the reaches (fewer as components take them)

    def test_components_use_the_public_seam(self):
        # the profiler's components (prof.comm, prof.flops, ...) reach it
        # through its public names alone: not even the patches' marks
        here = os.path.dirname(_marks.__file__)
        for name in _COMPONENTS:
            with open(os.path.join(here, name)) as f:
                reach = sorted(set(m.group(1) for m in _REACH.finditer(f.read())
                                   if not m.group(1).startswith(("__", "_tpsprof"))))  # (a torch profile's)
            self.assertEqual(reach, [], "%s reaches the profiler's private %s" % (name, reach))

    def test_no_private_writes(self):
        # no module writes another's private state: an assignment to
        # X._name is the module's own object's (self, cls) or a _tpsprof
        # marker on a foreign object (a wrapper, a writer class)
        import ast
        here = os.path.dirname(_marks.__file__)
        bad = []
        for name in sorted(os.listdir(here)):
            if not name.endswith(".py") or name == "torch.py":
                continue
            with open(os.path.join(here, name)) as f:
                tree = ast.parse(f.read())
            # a function the module defines is its own (PyTorch reads a
            # flag on a FLOP formula: _get_raw)
            own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            for node in ast.walk(tree):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                for target in targets:
                    for x in ast.walk(target):
                        if (isinstance(x, ast.Attribute) and x.attr.startswith("_") and not x.attr.startswith("__")
                                and not x.attr.startswith("_tpsprof") and x.attr not in _TORCH_PRIVATE
                                and not (isinstance(x.value, ast.Name) and (x.value.id in ("self", "cls") or x.value.id in own))):
                            bad.append("%s:%d %s" % (name, node.lineno, ast.unparse(target)))
        self.assertEqual(bad, [], "private state written across modules")

    def test_profiler_implements_every_mark(self):
        for name, fn in vars(_marks.Marks).items():
            if callable(fn) and name.startswith("_") and not name.startswith("__"):
                # (its own or its Loop's: tpsprof/_loop.py)
                self.assertIsNot(getattr(tt.TorchProfiler, name), fn, "TorchProfiler does not implement %s" % name)


if __name__ == "__main__":
    unittest.main()
