"""The user's source, where a finding names a line: how to show its file, the code of a
line, the loop around a line, the condition a line sits under.

Paths in a record are data, never pointers. The code a report shows comes from the record
itself: nsadiag.sourcelines.capture, called where the record is made, keeps the lines a
record names; the record carries that as ``"source"`` and ``sources_of(data)`` reads it
back. A record without it (made by an older nsadiag, or assembled in a test) reads the
files themselves only outside a render of a received directory
(nsadiag.runfiles.confined); a received one names its lines without their code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from nsadiag import runfiles
from nsadiag.sourcelines import (
    APPEND,
    DUMP_NAME,
    HOST_READ,
    MAX_DUMP_BYTES,
    MAX_FILES,
    SourceFile,
    capture,
    read_source,
)

__all__ = ["APPEND", "DUMP_NAME", "HOST_READ", "MAX_DUMP_BYTES", "SourceFile", "Sources",
           "capture", "carried_sources", "read_source", "sources_of"]


class Sources:
    """The source a finding may show (see the module docstring): ``stored`` files by path,
    and, when ``live``, this machine's files read on demand."""

    def __init__(self, stored: dict[str, SourceFile] | None = None, live: bool = False,
                 carried: bool = True):
        self.files: dict[str, SourceFile | None] = dict(stored or {})
        self.live, self.carried = live, carried

    def file(self, path: str) -> SourceFile | None:
        if path not in self.files:
            self.files[path] = read_source(path) if self.live else None
            if not self.live and not self.carried:
                runfiles.note("the record carries no source lines (written by an older "
                              "nsadiag): its lines are named without their code")
        return self.files[path]

    def display_path(self, path: str) -> str:
        found = self.file(path)
        return found.shown if found is not None else Path(path).name

    def code_at(self, path: str, line: int) -> str | None:
        """The stripped source of ``line`` of ``path``; None when it is not known."""
        found = self.file(path)
        return (found.lines.get(line) or "").strip() or None if found is not None else None

    def loop_around(self, path: str, line: int, variable: str | None = None
                    ) -> tuple[int, int] | None:
        """(first, last) line of the innermost loop that holds ``line``: with ``variable``,
        the ``for`` whose target names it (or a ``while`` whose test reads it), else any
        loop; None when no such loop is known."""
        found = self.file(path)
        inner = max((loop for loop in (found.loops if found else [])
                     if loop[0] <= line <= loop[1] and
                     (variable is None or variable in loop[2])),
                    key=lambda loop: loop[0], default=None)
        return (inner[0], inner[1]) if inner else None

    def loop_at(self, path: str, line: int) -> tuple[int, int] | None:
        """(first, last) line of the loop whose header is ``line`` (a ``while`` a process
        spins in), None when ``line`` starts no known loop."""
        found = self.file(path)
        return next(((a, b) for a, b, _ in (found.loops if found else []) if a == line), None)

    def condition_above(self, path: str, line: int) -> tuple[int, str] | None:
        """(line, code) of the innermost ``if`` whose body holds ``line`` (the condition
        a collective was issued under), None when there is none."""
        found = self.file(path)
        inner = max((i for i in (found.ifs if found else []) if i[0] < line and
                     i[1] <= line <= i[2]), key=lambda i: i[0], default=None)
        return (inner[0], self.code_at(path, inner[0]) or "") if inner else None


def sources_of(data: dict[str, Any]) -> Sources:
    """The source a stored record (attach.json) carries (``carried_sources``)."""
    return carried_sources(data.get("source") if isinstance(data, dict) else None)


def carried_sources(stored: Any) -> Sources:
    """The source a record carries (its ``source``: nsadiag.sourcelines.capture); a record
    without one reads this machine's files unless a received directory is being
    rendered."""
    if not isinstance(stored, dict):
        return Sources(live=not runfiles.confined(), carried=False)
    files = {}
    for path, entry in list((stored.get("files") or {}).items())[:MAX_FILES]:
        parsed = SourceFile.from_dict(entry)
        if parsed is not None:
            files[str(path)] = parsed
    return Sources(files)
