"""What in a directory is nsadiag's: the manifest of names it writes, the marker that makes
a directory one of its run directories, and the only ways it removes or moves entries.

The rule this module keeps: nsadiag deletes, moves or overwrites only what it wrote itself.

* A run directory carries MARKER_NAME, written when nsadiag first takes the directory
  (``claim``). Until then a directory is taken only when it is absent, empty, or holds
  nothing but names of nsadiag's manifest (a run directory written before the marker
  existed); a directory with anything else in it is refused by ``check_claimable`` in one
  line that names what is there, before anything is written.
* A directory with the marker may hold the user's files beside the run (a notes file, a
  checkpoint the user copied in): they are foreign, and nothing here touches them.
* A command that does not resume sets an earlier run aside by moving only nsadiag's own
  entries into ``.nsadiag-earlier-XXXXXX`` inside the run directory (``set_aside``), puts
  them back when the new run ends without a verdict (``restore_earlier``) and removes them
  once it has one (``drop_earlier``). A removal walks the entries and removes only those
  the manifest names (``remove_ours``), so even a planted or mistaken path removes nothing
  of the user's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from pathlib import Path, PurePosixPath

LOCK_NAME = ".nsadiag.lock"
RESERVE_NAME = ".nsadiag.reserve"
REDACTION_NAME = "redaction.json"
MARKER_NAME = ".nsadiag-run"
MARKER_TEXT = b"an nsadiag run directory: nsadiag replaces only the files it wrote here\n"
ASIDE_PREFIX = ".nsadiag-earlier-"
PRIVATE = frozenset({LOCK_NAME, RESERVE_NAME, REDACTION_NAME, MARKER_NAME})
"""nsadiag's own bookkeeping: never shared (redaction.json holds the values it hides)."""
WRITTEN = frozenset({
    "run.json", "spec.json", "job.json", "trials.jsonl", "report.md", "summary.json",
    "record.json", "evidence.json", "result.json", "checks.json", "check.json", "triage.json",
    "memory.json", "trace-result.json", "trace.json", "profiler-trace.json", "stacks.json",
    "attach.json", "block.json", "events.jsonl", "profile.json", "profile.folded",
    "faulthandler.txt", "stdout.txt", "stderr.txt", "watch-helper.txt", "dump-request",
    "hosts-trace.json", "sweep.png", "memory.png", "flame.png", "snapshot.pickle",
    "finding.json", "events.slot", "process-memory.png", "child-exits.jsonl",
    "thread-exceptions.jsonl"})
"""The names of the files nsadiag writes into a run directory (and its trial, rank, process,
check and flight-recorder directories); ``written_by_nsadiag`` is the whole manifest."""
RECORD_NAMES = ("record.json", "trials.jsonl", "summary.json", "run.json", "triage.json",
                "attach.json", "checks.json", "memory.json", "trace-result.json",
                "stacks.json")
"""Files whose presence shows a directory was written by nsadiag before it had a marker."""
_WRITTEN_DIR = re.compile(r"(?:trial|rank|proc)-\d+|flight-recorder|checks|causality|parity|"
                          r"ckpt|ddp|ab-[a-z0-9-]+")
_WRITTEN_PATTERN = re.compile(r"rank-\d+\.json|fork-\d+\.json|[^/]+-redacted\.tar\.gz")
"""A rank's flight-recorder dump; a forked child's note (nsadiag.probes.forks); the redacted
bundle (nsadiag.report.bundle)."""
_PROBE = re.compile(r"\.write-test\.[^/]+")  # the writability probe of a run directory


def written_by_nsadiag(relative: str | PurePosixPath) -> bool:
    """Whether a path relative to a run directory is one nsadiag writes there (by name: the
    manifest says nothing about what the file now is; see write_bundle)."""
    parts = PurePosixPath(relative).parts
    if not parts or any(not _WRITTEN_DIR.fullmatch(p) for p in parts[:-1]):
        return False
    return parts[-1] in WRITTEN or bool(_WRITTEN_PATTERN.fullmatch(parts[-1]))


def written_dir(name: str) -> bool:
    """Whether ``name`` is a directory nsadiag makes inside a run directory."""
    return bool(_WRITTEN_DIR.fullmatch(name))


def ours(name: str, is_dir: bool) -> bool:
    """Whether an entry of a run directory (or of one of nsadiag's directories in it) is
    nsadiag's by its name and kind: a manifest file, one of nsadiag's directories, its
    private bookkeeping, a temporary of its own writes or a run it set aside."""
    if is_dir:
        return written_dir(name) or name.startswith(ASIDE_PREFIX)
    return _manifest_file(name) or name in PRIVATE or own_temporary(name)


def _manifest_file(name: str) -> bool:
    return name in WRITTEN or bool(_WRITTEN_PATTERN.fullmatch(name))


def own_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary of one of nsadiag's own writes: ``X.tmp`` (a
    profile, a result, a flight-recorder dump) or ``.X.<random>.tmp`` (a whole-file write,
    rundir.write_bytes; a bundle) of a manifest name X, or the writability probe."""
    if _PROBE.fullmatch(name):
        return True
    if not name.endswith(".tmp"):
        return False
    stem = name[:-len(".tmp")]
    if _manifest_file(stem) or _manifest_file(stem.rsplit(".", 1)[0] + ".json"):
        return True  # X.tmp; rank-N.tmp (flight_recorder: with_suffix(".tmp"))
    return stem.startswith(".") and (_manifest_file(stem[1:]) or
                                     _manifest_file(stem[1:].rsplit(".", 1)[0]))


def _entries(path: Path) -> list[os.DirEntry[str]]:
    try:
        return list(os.scandir(path))
    except FileNotFoundError:
        return []


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def foreign(path: Path) -> list[str]:
    """The entries of ``path`` that are not nsadiag's, sorted, a directory with a trailing
    '/'. A link counts as foreign whatever its name points to unless the name is one of
    nsadiag's files (nsadiag's writes replace such a link, never follow it)."""
    return sorted(e.name + ("/" if _is_dir(e) else "") for e in _entries(path)
                  if not ours(e.name, _is_dir(e)))


def is_marked(path: Path) -> bool:
    """Whether ``path`` carries nsadiag's marker (a regular file, never followed)."""
    try:
        return stat.S_ISREG(os.lstat(path / MARKER_NAME).st_mode)
    except OSError:
        return False


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` holds a run of nsadiag's to render: it carries the marker, or
    (written before the marker existed, or received from someone) one of its record
    files. A render writes only nsadiag's own files there; taking a directory as ``--out``
    asks more (``check_claimable``)."""
    if is_marked(path):
        return True
    try:
        names = {e.name for e in _entries(path)}
    except OSError:
        return False
    return bool(names & set(RECORD_NAMES))


def check_run_dir(path: Path, what: str = "run_dir") -> None:
    """ValueError (one line) unless ``path`` is one of nsadiag's run directories
    (``is_run_dir``): a command that renders or bundles one writes nothing into anything
    else (not even its lock)."""
    if not path.is_dir():
        raise ValueError(f"{what}: {path} is not a directory")
    if not is_run_dir(path):
        strange = foreign(path)
        held = f" (it holds {_listed(strange)})" if strange else " (it is empty)" \
            if not _entries(path) else ""
        raise ValueError(f"{what}: {path} is not an nsadiag run directory{held}; nothing was "
                         f"written: give a directory that an nsadiag command wrote")


def _listed(names: list[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def check_claimable(path: Path) -> None:
    """ValueError (one line, exit 2 at the command line) when ``path`` is a directory that
    holds files nsadiag did not write and is not one of its run directories; nothing is
    written or removed either way. A path that is not a directory is left to the
    writability check, which names it."""
    if not path.is_dir() or path.is_symlink() or is_marked(path):
        return
    strange = foreign(path)
    if strange:
        raise ValueError(f"out: {path} already holds files nsadiag did not write "
                         f"({_listed(strange)}); nothing was touched: give a new or empty "
                         f"directory, or one of nsadiag's run directories")


def claim(path: Path) -> None:
    """Mark ``path`` (already checked by ``check_claimable``) as an nsadiag run directory;
    OSError when the marker cannot be written."""
    if is_marked(path):
        return
    fd = os.open(path / MARKER_NAME, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW |
                 os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, MARKER_TEXT)
    finally:
        os.close(fd)


def remove_ours(path: Path) -> list[str]:
    """Remove what nsadiag wrote in the directory ``path`` (recursively, by the manifest)
    and then ``path`` itself when that left it empty; whatever else is there stays. A link
    is removed only as a name, never followed. The foreign entries left, relative to
    ``path``."""
    kept: list[str] = []
    for entry in _entries(path):
        is_dir = _is_dir(entry)
        if not ours(entry.name, is_dir):
            kept.append(entry.name + ("/" if is_dir else ""))
        elif is_dir:
            kept += [f"{entry.name}/{name}" for name in remove_ours(Path(entry.path))]
        elif entry.name not in (LOCK_NAME,):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    with contextlib.suppress(OSError):
        path.rmdir()  # only when nothing is left
    return kept


def _movable(entry: os.DirEntry[str]) -> bool:
    """An entry of an earlier run that a fresh run sets aside: nsadiag's, but not its
    bookkeeping (the lock this process holds, the reserve, the marker, what redaction
    hides) nor a run set aside earlier."""
    is_dir = _is_dir(entry)
    return (ours(entry.name, is_dir) and entry.name not in PRIVATE and
            not entry.name.startswith(ASIDE_PREFIX) and not own_temporary(entry.name))


def set_aside(path: Path) -> Path | None:
    """For a command that does not resume: move the earlier run's own entries out of the
    locked ``path`` into a new ``.nsadiag-earlier-XXXXXX`` inside it and return that
    directory; None when there was nothing of nsadiag's to set aside. The user's files stay
    where they are. ValueError (one line) when it cannot be done, with what was moved put
    back."""
    earlier = [e.name for e in _entries(path) if _movable(e)]
    if not earlier:
        return None
    try:
        aside = Path(tempfile.mkdtemp(dir=path, prefix=ASIDE_PREFIX))
    except OSError as err:
        raise ValueError(f"out: cannot set the earlier run in {path} aside: "
                         f"{err.strerror or err}") from None
    moved: list[str] = []
    try:
        for name in earlier:
            os.rename(path / name, aside / name)
            moved.append(name)
    except OSError as err:
        for name in moved:
            with contextlib.suppress(OSError):
                os.rename(aside / name, path / name)
        with contextlib.suppress(OSError):
            aside.rmdir()
        raise ValueError(f"out: cannot set the earlier run in {path} aside: "
                         f"{err.strerror or err}") from None
    return aside


def restore_earlier(path: Path, earlier: Path | None) -> None:
    """The new run ended without a verdict: remove the new run's own entries from ``path``
    and move the earlier run's back (nothing when none was set aside). An entry that
    cannot be moved stays set aside, under its name."""
    if earlier is None:
        return
    for entry in _entries(path):
        if _movable(entry):
            _remove_entry(entry)
    for entry in _entries(earlier):
        with contextlib.suppress(OSError):
            os.rename(entry.path, path / entry.name)
    with contextlib.suppress(OSError):
        earlier.rmdir()


def _remove_entry(entry: os.DirEntry[str]) -> None:
    if _is_dir(entry):
        remove_ours(Path(entry.path))
    else:
        with contextlib.suppress(OSError):
            os.unlink(entry.path)


def drop_earlier(earlier: Path | None) -> None:
    """The new run has its verdict: remove the earlier run set aside (only nsadiag's files
    in it)."""
    if earlier is not None:
        remove_ours(earlier)


def set_aside_runs(path: Path) -> list[Path]:
    """Earlier runs that an nsadiag set aside in ``path`` and could not put back or remove
    (it was killed with SIGKILL during a rerun), oldest first."""
    found = [Path(e.path) for e in _entries(path)
             if e.name.startswith(ASIDE_PREFIX) and _is_dir(e)]
    return sorted(found, key=lambda p: p.lstat().st_mtime)


def remove_tree_of_ours(path: Path) -> None:
    """``remove_ours`` for a directory nsadiag made itself (a trial's directory about to be
    written again): a link of that name is removed as a name; OSError for a file there."""
    if path.is_symlink():
        path.unlink()
    elif path.is_dir():
        remove_ours(path)
        if path.exists():
            left = ", ".join(foreign(path)) or "files that could not be removed"
            raise OSError(errno.ENOTEMPTY, f"holds {left}", str(path))
    elif path.exists():
        raise OSError(errno.EEXIST, "is a file, not nsadiag's directory", str(path))
