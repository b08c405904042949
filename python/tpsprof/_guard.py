"""One guard for installing hooks: a family of hooks that cannot be put in
place (an incompatible PyTorch, a patched library) is recorded with why,
never raised into the training process, and reported once.

``installed()`` is the record of which hook families are live and how:
the package sends it with the run metadata (``hooks``), and a measure a
missing family would have taken goes out as unmeasured with the reason.
"""

import functools
import threading

_lock = threading.Lock()
_record = {}  # family -> "on", how it is hooked ("dispatcher"), or "off: why"


def install(family):
    """Decorates an install function of a hook family. It runs guarded: its
    result (a string saying how the family is hooked, True or None for
    "on", False for "off: not available") is recorded; an exception is
    caught and recorded as "off: <its type>: <its words>"."""
    def deco(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            try:
                got = fn(*args, **kwargs)
            except Exception as e:
                state = "off: %s: %s" % (type(e).__name__, str(e)[:120])
                got = None
            else:
                if got is False:
                    state = "off: not available"
                elif isinstance(got, str):
                    state = got
                else:
                    state = "on"
            with _lock:
                if not _record.get(family, "").startswith(("on", "dispatcher", "functions")) or not state.startswith("off"):
                    _record[family] = state
            return got
        return run
    return deco


def note(family, state):
    """Records how a family is hooked when that is decided after start-up
    (synchronous collectives timed by their waits once sampling starts)."""
    with _lock:
        _record[family] = state


def installed():
    """A copy of the record: family -> how it is hooked, or "off: why"."""
    with _lock:
        return dict(_record)


def off(family):
    """Why family is not hooked ("" when it is, or was never tried)."""
    with _lock:
        s = _record.get(family, "")
    return s[len("off: "):] if s.startswith("off") else ""
