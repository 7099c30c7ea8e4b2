"""How the children of a watched process ended, recorded for the wait chain.

A worker of a ``multiprocessing.Pool`` that is killed (the out-of-memory killer sends
SIGKILL) is reaped by the pool, which starts another in its place; the task it ran is lost
and the pool's results are awaited forever. By the time the stall is noticed the killed
worker is gone from /proc, and only its parent ever saw its exit status. ``install(path)``
wraps the poll of multiprocessing's process handles (fork and spawn share one, forkserver
has its own) so that the first time a child's exit status is read, a JSON line is appended
to ``path``: t, pid, name (multiprocessing's name of the process, "ForkPoolWorker-2") and
returncode (negative: the signal that killed it). ``read(path)`` reads them back as
nsadiag.waitfacts.EndedProcess. Standard library only: it runs in the watched process.
"""

from __future__ import annotations

import json
import multiprocessing.process
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsadiag.waitfacts import EndedProcess

FILE_NAME = "child-exits.jsonl"


def _name(handle: Any) -> str:
    """multiprocessing's name of the process behind a Popen handle ("" when it is not among
    the live children, which it still is while its exit status is first read: join removes
    it only after)."""
    # process._children holds the Process objects this process started; reading it is the
    # only way from a Popen handle back to the name the pool gave the worker
    children = getattr(multiprocessing.process, "_children", ())
    return next((str(p.name) for p in list(children) if getattr(p, "_popen", None) is handle),
                "")


def _handle_classes() -> list[type]:
    from multiprocessing import popen_fork
    classes: list[type] = [popen_fork.Popen]
    try:
        from multiprocessing import popen_forkserver
    except ImportError:  # a platform without forkserver
        return classes
    return [*classes, popen_forkserver.Popen]


def install(path: Path) -> Callable[[], None]:
    """Record each child's exit status into ``path`` once it is first read (see the module
    docstring); returns the function that puts the previous polls back. Only this process
    records: a forked child keeps the wrapper but writes nothing."""
    pid = os.getpid()
    previous: dict[type, Any] = {}

    def wrapped(original: Any) -> Any:
        def poll(self: Any, *args: Any, **kwargs: Any) -> Any:
            before = self.returncode
            code = original(self, *args, **kwargs)
            if before is None and code is not None and os.getpid() == pid:
                record = {"t": time.time(), "pid": self.pid, "name": _name(self),
                          "returncode": code}
                try:
                    with open(path, "a", encoding="utf-8") as handle:
                        handle.write(json.dumps(record) + "\n")
                except OSError:
                    pass  # the user's program goes on as if nothing were recorded
            return code
        return poll

    for cls in _handle_classes():
        original = cls.__dict__["poll"]
        previous[cls] = original
        cls.poll = wrapped(original)  # type: ignore[attr-defined]

    def uninstall() -> None:
        for cls, original in previous.items():
            cls.poll = original  # type: ignore[attr-defined]

    return uninstall


def read(path: Path) -> tuple[EndedProcess, ...]:
    """The recorded children, first ended first (() when none or unreadable)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ()
    found = []
    for line in lines:
        try:
            found.append(EndedProcess.from_dict(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return tuple(found)
