"""Code run once a module has been imported: the patches of frameworks a
job may import after tpsprof (torch itself for zero-code mode, Accelerate's
loaders, torch.distributed.checkpoint's save and load)."""

import importlib.abc
import importlib.util
import sys


def after_import(name, fn):
    """Calls fn(module) once module ``name`` has been imported (now, if it
    is already); an fn that raises is said on stderr, the job runs on. The
    same fn asked again for a module not imported yet is called once."""
    if name in sys.modules:
        _call(name, fn, sys.modules[name])
        return
    for f in sys.meta_path:
        if isinstance(f, AfterImport) and f.name == name:
            if fn not in f.fns:  # (every profiler installs its patches)
                f.fns.append(fn)  # one finder a module: a second would never see its import
            return
    sys.meta_path.insert(0, AfterImport(name, fn))


def _call(name, fn, module):
    try:
        fn(module)
    except Exception as e:
        sys.stderr.write("tpsprof: the patches for %s not installed: %r\n" % (name, e))


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls each of its fns(module) once module ``name`` has finished
    importing."""

    def __init__(self, name, fn):
        self.name, self.fns = name, [fn]

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        inner, fns = spec.loader.exec_module, self.fns

        def exec_module(module):
            inner(module)
            for fn in fns:
                _call(name, fn, module)
        spec.loader.exec_module = exec_module
        return spec
