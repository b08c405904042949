# tpsprof zero-code mode: `tpsprof launch --auto` puts this folder on the
# PYTHONPATH. It arms tpsprof's capture (effective once torch is imported)
# and then runs the sitecustomize this one shadows, if there is one.
import os as _os
import sys as _sys


def _tpsprof_boot():
    here = _os.path.dirname(_os.path.abspath(__file__))
    try:
        import tpsprof._auto
        tpsprof._auto.arm()
    except Exception as e:  # never stop the script
        _sys.stderr.write("tpsprof: zero-code capture unavailable: %r\n" % (e,))
    saved = list(_sys.path)
    mod = _sys.modules.pop("sitecustomize", None)
    try:
        _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
        import importlib
        importlib.import_module("sitecustomize")
    except ImportError:
        if mod is not None:
            _sys.modules["sitecustomize"] = mod
    finally:
        _sys.path[:] = saved


_tpsprof_boot()
