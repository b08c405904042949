# tpsprof zero-code mode: `tpsprof launch --auto` puts this folder on the
# PYTHONPATH. It arms tpsprof's capture (effective once torch is imported)
# and then runs the sitecustomize this one shadows, if there is one, as
# Python would have: under the name sitecustomize, with sys.path as it is
# (what it adds to sys.path stays), an error in it shown, not swallowed.
import os as _os
import sys as _sys


def _tpsprof_boot():
    here = _os.path.dirname(_os.path.abspath(__file__))
    try:
        import tpsprof._auto
        tpsprof._auto.arm()
    except Exception as e:  # never stop the script
        _sys.stderr.write("tpsprof: zero-code capture unavailable: %r\n" % (e,))
    import importlib.machinery
    import importlib.util
    others = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    except Exception:
        spec = None
    if spec is None or spec.loader is None:
        return
    ours = _sys.modules.get("sitecustomize")
    try:
        mod = importlib.util.module_from_spec(spec)
        _sys.modules["sitecustomize"] = mod
        spec.loader.exec_module(mod)
    except Exception as err:
        # what site.py does with an error in sitecustomize
        if ours is not None:
            _sys.modules["sitecustomize"] = ours
        import traceback
        _sys.stderr.write("Error in sitecustomize (%s), run after tpsprof's zero-code hook:\n" % spec.origin)
        traceback.print_exception(type(err), err, err.__traceback__, file=_sys.stderr)


_tpsprof_boot()
