"""Exceptions that end a thread other than the main one, recorded for the verdict.

A thread that dies of an exception does not end the process: Python prints its traceback
(``threading.excepthook``) and the thread is gone. When the main thread then waits for
what that thread would have produced, the run hangs, and the cause is a traceback lost in
the middle of stderr. ``install(path)`` wraps ``threading.excepthook`` so that every such
exception is also appended to ``path`` (JSON lines, one per exception: t, thread, type,
message, where, traceback), then passed on to the previous hook, which prints it as
before. ``read(path)`` reads them back.

``where`` is the innermost frame of the traceback outside installed packages and the
standard library ("parse (train.py:30)"), else the innermost frame.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsadiag.probes.frames import LIBRARY_PATH

FILE_NAME = "thread-exceptions.jsonl"


def _where(tb: Any) -> str | None:
    frames = traceback.extract_tb(tb)
    own = [frame for frame in frames if not LIBRARY_PATH.search(frame.filename)]
    frame = (own or frames or [None])[-1]
    if frame is None:
        return None
    return f"{frame.name} ({os.path.basename(frame.filename)}:{frame.lineno})"


def describe(args: Any) -> dict[str, Any]:
    """One record of a ``threading.ExceptHookArgs``."""
    value = args.exc_value
    message = str(value) if value is not None else ""
    return {"t": time.time(), "thread": getattr(args.thread, "name", None),
            "type": getattr(args.exc_type, "__name__", str(args.exc_type)),
            "message": message.splitlines()[0] if message else "",
            "where": _where(args.exc_traceback),
            "traceback": "".join(traceback.format_exception(args.exc_type, value,
                                                            args.exc_traceback))}


def install(path: Path) -> Callable[[], None]:
    """Record every thread's uncaught exception into ``path`` (see the module docstring);
    returns the function that puts the previous hook back. Only this process records: a
    forked child (a data worker) keeps the hook but writes nothing."""
    previous = threading.excepthook
    pid = os.getpid()

    def hook(args: Any) -> None:
        if os.getpid() == pid and args.exc_type is not SystemExit:
            try:
                with open(path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(describe(args)) + "\n")
            except OSError:
                pass  # the user's traceback still reaches stderr below
        previous(args)

    threading.excepthook = hook

    def uninstall() -> None:
        if threading.excepthook is hook:
            threading.excepthook = previous

    return uninstall


def read(path: Path) -> list[dict[str, Any]]:
    """The recorded exceptions, oldest first ([] when none or unreadable)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return found
