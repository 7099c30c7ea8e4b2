"""How the children of a watched process ended, recorded for the wait chain.

A worker of a ``multiprocessing.Pool`` that is killed (the out-of-memory killer sends
SIGKILL) is reaped by the pool, which starts another in its place; the task it ran is lost
and the pool's results are awaited forever. By the time the stall is noticed the killed
worker is gone from /proc, and only its parent ever saw its exit status. ``install(path)``
wraps the three ways multiprocessing reads a child's end (``Process.exitcode``,
``is_alive`` and ``join``: a pool reads ``exitcode``, a DataLoader ``is_alive``, an
executor ``join``) so that the first time a child's exit status is known, a JSON line is
appended to ``path``: t, pid, name (multiprocessing's name of the process,
"ForkPoolWorker-2") and returncode (negative: the signal that killed it). ``read(path)``
reads them back as nsadiag.waitfacts.EndedProcess. Standard library only: it runs in the
watched process, and multiprocessing.process imports nothing the watched process has not.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from nsadiag.waitfacts import EndedProcess

FILE_NAME = "child-exits.jsonl"


def install(path: Path) -> Callable[[], None]:
    """Record each child's exit status into ``path`` once it is first known (see the module
    docstring); returns the function that puts the previous methods back. Only this
    process records: a forked child keeps the wrappers but writes nothing."""
    pid = os.getpid()
    recorded: set[int] = set()
    exitcode = BaseProcess.__dict__["exitcode"]
    is_alive, join = BaseProcess.__dict__["is_alive"], BaseProcess.__dict__["join"]

    def record(process: Any) -> None:
        handle = getattr(process, "_popen", None)
        code = getattr(handle, "returncode", None)
        if code is None or os.getpid() != pid or handle.pid in recorded:
            return
        recorded.add(handle.pid)
        line = {"t": time.time(), "pid": handle.pid, "name": str(process.name),
                "returncode": code}
        try:
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")
        except OSError:
            pass  # the user's program goes on as if nothing were recorded

    def read_exitcode(process: Any) -> Any:
        code = exitcode.fget(process)
        record(process)
        return code

    def checked_is_alive(process: Any) -> Any:
        alive = is_alive(process)
        record(process)
        return alive

    def checked_join(process: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return join(process, *args, **kwargs)
        finally:
            record(process)

    BaseProcess.exitcode = property(read_exitcode, doc=exitcode.__doc__)  # type: ignore
    BaseProcess.is_alive = checked_is_alive  # type: ignore[method-assign]
    BaseProcess.join = checked_join  # type: ignore[method-assign]

    def uninstall() -> None:
        BaseProcess.exitcode = exitcode  # type: ignore[misc]
        BaseProcess.is_alive = is_alive  # type: ignore[method-assign]
        BaseProcess.join = join  # type: ignore[method-assign]

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
