"""Files a record names, read as data from inside the run directory being rendered.

A run directory may come from someone else, and its records name paths: a trial directory,
a profile, faulthandler dumps. While ``rendering(run_dir)`` is active (every report is
rendered inside it: nsadiag.report.dispatch) a path from a record is opened only when,
resolved, it lies inside the run directory, is a regular file and not a symbolic link
(opened with O_NOFOLLOW and O_NONBLOCK, so a FIFO or a device neither blocks nor streams
without end), and is no larger than the cap its reader gives. Whatever is refused is said
in one line each (``notes``), which the report lists. A trial directory outside the run
directory (``"/"``, another user's home) is ignored, save that of a run directory that
was moved whole: ``trial-N`` named by an old absolute path is read as ``DIR/trial-N``.

Outside ``rendering`` (the process that has just written the directory) the paths are the
ones it wrote, and only the regular-file and size checks apply.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nsadiag.rundir import open_regular
from nsadiag.store.owned import written_dir


@dataclass
class _Scope:
    root: Path  # resolved
    notes: list[str] = field(default_factory=list)


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("runfiles_scope",
                                                                       default=None)
MAX_FOUND = 256
"""At most this many directory entries looked at per directory when searching a trial
directory for a file (a planted directory of millions of entries costs nothing more)."""


@contextlib.contextmanager
def rendering(run_dir: Path) -> Iterator[list[str]]:
    """Confine every read of a path a record names to ``run_dir``; yields the list of
    lines saying what was refused."""
    scope = _Scope(run_dir.resolve())
    token = _SCOPE.set(scope)
    try:
        yield scope.notes
    finally:
        _SCOPE.reset(token)


def confined() -> bool:
    """Whether a received run directory is being rendered (no path outside it is read)."""
    return _SCOPE.get() is not None


def note(line: str) -> None:
    """Say, once, in the report being rendered, that something named by a record was not
    read."""
    scope = _SCOPE.get()
    if scope is not None and line not in scope.notes:
        scope.notes.append(line)


def _shown(path: Path | str) -> str:
    return repr(str(path)[:200])


def _inside(path: Path, scope: _Scope) -> Path | None:
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a loop of links
        return None
    return resolved if resolved.is_relative_to(scope.root) else None


def trial_dir(recorded: str) -> Path | None:
    """The directory a record's ``trial_dir`` stands for (see the module docstring); None,
    with a note, when it lies outside the run directory being rendered."""
    path = Path(recorded)
    scope = _SCOPE.get()
    if scope is None:
        return path
    if path.is_absolute():
        found = _inside(path, scope)
        if found is not None:
            return found
    moved = scope.root / path.name
    if path.name and written_dir(path.name) and not moved.is_symlink() and moved.is_dir():
        return moved
    note(f"trial_dir {_shown(recorded)}: outside the run directory, ignored")
    return None


def read_bytes(path: Path, max_bytes: int, what: str) -> bytes | None:
    """The content of ``path`` when it may be read (see the module docstring), else None
    with a note naming ``what`` and why."""
    scope = _SCOPE.get()
    if scope is not None and _inside(path.parent, scope) is None:
        note(f"{what} {_shown(path)}: outside the run directory, not read")
        return None
    try:
        with open_regular(path, what) as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                note(f"{what} {_shown(path)}: {size / 2**20:.0f} MiB, larger than "
                     f"{max_bytes / 2**20:.0f} MiB, not read")
                return None
            return f.read(max_bytes)
    except ValueError as err:
        if path.is_symlink() or path.exists():  # a link or a FIFO is worth saying
            note(str(err))
        return None
    except OSError:
        return None


def find(directory: Path, name: str, depth: int = 2) -> list[Path]:
    """The regular files called ``name`` in ``directory`` and in the directories nsadiag
    makes inside it (``rank-N``, ``proc-N``, ...), ``depth`` levels down, links not
    followed; sorted, at most MAX_FOUND entries read per directory."""
    found: list[Path] = []
    try:
        entries = os.scandir(directory)
    except OSError:
        return found
    with entries:
        for seen, entry in enumerate(entries):
            if seen >= MAX_FOUND:
                note(f"{_shown(directory)}: more than {MAX_FOUND} entries, the rest not "
                     f"searched for {name}")
                break
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if entry.name == name and stat.S_ISREG(mode):
                found.append(Path(entry.path))
            elif depth > 0 and stat.S_ISDIR(mode) and written_dir(entry.name):
                found += find(Path(entry.path), name, depth - 1)
    return sorted(found)
