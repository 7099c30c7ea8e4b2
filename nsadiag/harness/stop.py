"""A stop the user asked for (Ctrl-C, SIGTERM, SIGHUP), remembered until the process exits.

The command line's signal handler raises KeyboardInterrupt at once, wherever the main
thread is, so that a cancelled diagnosis unwinds through the kill paths. Code can swallow
that exception: an import made from C that clears Python errors loses it (importing torch
imports numpy that way; a SIGTERM landing there was lost and nsadiag ran its trial to the
end). So the handler also calls `request()`, and every loop that waits on a diagnosis's
processes calls `check()` on each poll, which raises KeyboardInterrupt again.
"""

from __future__ import annotations

import threading

_requested = threading.Event()


def request() -> None:
    """Remember that the user asked to stop (called from the signal handler)."""
    _requested.set()


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise KeyboardInterrupt when a stop was requested."""
    if _requested.is_set():
        raise KeyboardInterrupt
