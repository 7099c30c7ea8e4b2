"""A stop the user asked for (Ctrl-C, SIGTERM, SIGHUP), remembered until the process exits.

The command line's signal handler raises KeyboardInterrupt at once, wherever the main
thread is, so that a cancelled diagnosis unwinds through the kill paths. Code can swallow
that exception: an import made from C that clears Python errors loses it (importing torch
imports numpy that way; a SIGTERM landing there was lost and nsadiag ran its trial to the
end). So the handler also calls `request()`, and every loop that waits on a diagnosis's
processes calls `check()` on each poll, which raises KeyboardInterrupt again.

Which signal it was is remembered too: the exit code is the shell's for it (128 + the
signal: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), and the record of an interrupted
run says what stopped it (``Kept`` carries what was written before the exit).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

_requested = threading.Event()
_how: dict[str, Any] = {}
SIGNAL_EXIT_BASE = 128
"""A process ended by a signal exits 128 + its number in the shell's convention."""
CAUSES = {signal.SIGINT: "the user (Ctrl-C)",
          signal.SIGTERM: "SIGTERM (a cancelled job, `timeout` or `kill`)",
          signal.SIGHUP: "SIGHUP (its terminal closed)"}


def request(signum: int = signal.SIGINT) -> None:
    """Remember that the user asked to stop, by which signal and when (called from the
    signal handler; the first request is the one remembered)."""
    if not _requested.is_set():
        _how.update(signum=signum, at=time.time())
    _requested.set()


def requested() -> bool:
    return _requested.is_set()


def check() -> None:
    """Raise KeyboardInterrupt when a stop was requested."""
    if _requested.is_set():
        raise KeyboardInterrupt


def exit_code() -> int:
    """128 + the signal that asked to stop (130 when none was remembered: an interrupt
    raised without a signal, as a test's KeyboardInterrupt)."""
    return SIGNAL_EXIT_BASE + int(_how.get("signum", signal.SIGINT))


def cause() -> str:
    """Who or what asked to stop, in words ("the user (Ctrl-C)")."""
    return CAUSES.get(_how.get("signum", signal.SIGINT), "a signal")


def signal_name() -> str:
    return signal.Signals(_how.get("signum", signal.SIGINT)).name


def requested_at() -> float | None:
    """When the stop was asked for (time.time()), None when no signal asked."""
    return _how.get("at")


class Kept(KeyboardInterrupt):
    """An interrupted command whose diagnosis so far was written before it exits: ``kept``
    is what was written (the rendered report), for the command line to show."""

    def __init__(self, kept: Any):
        super().__init__()
        self.kept = kept
