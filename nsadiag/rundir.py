"""The run directory: where a command keeps what it ran and what it found.

    runs/<UTC time>-<command>/
        run.json        the run's kind (command_name), its argv, the environment
        spec.json       the base trial spec
        trials.jsonl    one TrialRecord per finished trial, appended and fsynced in order
        trial-<n>/      a trial's own files (spec, heartbeat events, stacks, result)
        finding.json    the finding of a sweep, a DDP job or a triage, decided once when it
                        ended, and what it was decided against (``keep_finding``)
        report.md, summary.json, plots
        redaction.json  what the run's reports hide (nsadiag.redact), private

One nsadiag at a time per run directory: ``prepare_run_dir`` takes an exclusive
``flock`` on ``.nsadiag.lock`` in it and holds it until the process exits (or
``release_run_dir``); a second process preparing the same directory gets a one-line
ValueError naming the holder's pid. The kernel drops the lock when its holder dies, however
it dies (``kill -9`` included), so a stale lock file never blocks a later run; the lock's
descriptor is close-on-exec, so children started by the holder do not keep it. ``locked``
holds it for a while (`nsadiag report` renders under it, waiting a little for another).

A run directory is shared, so one received from someone else is untrusted: any name in it
may be a symbolic link planted to a file outside (``~/.bashrc``), a hard link, a FIFO. No
write into it goes through one: whole files are written to an exclusive temporary
(``O_EXCL``, a fresh name) and renamed over the name, which replaces a link instead of
following it (``write_bytes``, ``write_text``, ``write_json``); streams are new files
(``create_file``: the old entry removed, then ``O_CREAT | O_EXCL``); trials.jsonl and the
lock are opened with ``O_NOFOLLOW`` and must be regular files with one link. Stored records
are read the same way (``open_regular``): a link, a FIFO or a file above MAX_JSON_BYTES is
one ValueError line, never a read of something outside. ``WRITTEN`` is the manifest of
what nsadiag writes into a run directory (``written_by_nsadiag``): the bundle takes
nothing else.

A rerun of the same command in the same directory resumes: a trial whose spec (without its
directory) is already recorded is not run again (``spec_key``), and new trial directories
are numbered past the highest existing one (``next_trial_index``). A command that does not
resume (`nsadiag run`) and is given a directory that holds an earlier run sets the earlier
one's files aside (``set_aside``: into ``.nsadiag-earlier-XXXXXX`` inside it) and removes
them only once the new run has its verdict (``drop_earlier``); a run that ends without one
puts them back (``restore_earlier``), so the directory never holds parts of two runs.
What nsadiag may take, move or remove is nsadiag.store.owned's: a directory that holds
files nsadiag did not write and carries no run-directory marker is refused before anything
is written, and the user's files beside a run are never moved or removed.

trials.jsonl is never left with a torn record by nsadiag: a record is one line written by
one ``write`` on an O_APPEND descriptor and fsynced; a write that fails part-way (a full
disk) is cut off again before the error is raised. A line torn by something else (a
killed writer, a copy cut short), a record that is not a trial record, one from a newer
schema or one longer than MAX_RECORD_BYTES is skipped by ``load_records`` and reported to
its ``skipped`` list; the file is read line by line and at most MAX_RECORDS_BYTES of
records are kept, so its size bounds nothing but the time to read it.

A full disk: ``prepare_run_dir`` sets RESERVE_BYTES aside in the directory
(``.nsadiag.reserve``); a whole-file write that fails for want of space gives the reserve
back and tries once more, so the verdict and the report still fit when the copies of a
command's output filled the disk. A file that cannot be written raises ValueError with one
line naming it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from nsadiag.evidence import Evidence
from nsadiag.findingdata import Finding
from nsadiag.probes.gpu import GpuState, gpu_json, gpu_of
from nsadiag.recordspec import RecordSpec
from nsadiag.redact import record_of_this_process
from nsadiag.schema import SCHEMA_VERSION, definition_errors, errors
from nsadiag.store.owned import (
    LOCK_NAME,
    PRIVATE,
    REDACTION_NAME,
    RESERVE_NAME,
    check_claimable,
    claim,
    remove_ours,
    restore_earlier,
    set_aside,
    set_aside_runs,
)
from nsadiag.verdict.names import FAILURES, TIMING, Verdict, VerdictName
from nsadiag.verdictfacts import VerdictFacts


class RecordError(ValueError):
    """A stored record that is not what its reader parses: a trials.jsonl line or a
    record.json that breaks the trial schema, or a stored JSON file whose parser found a key
    missing or a value of the wrong type. Raised where the record is read (``parse_stored``,
    ``TrialRecord.from_dict``), with one line naming it; what reads a parsed record further
    may trust its shape."""


Parsed = TypeVar("Parsed")


def parse_stored(what: str, parse: Callable[[Any], Parsed], data: Any) -> Parsed:
    """``parse(data)`` of a record read from the file ``what``; RecordError (one line) when
    the parser finds the data malformed: a key missing, a value of the wrong type or shape.
    Only the parsing is guarded, so a fault of whatever uses the parsed record is not taken
    for a malformed file."""
    try:
        return parse(data)
    except RecordError:
        raise
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as err:
        raise RecordError(f"{what}: a stored record is malformed "
                          f"({type(err).__name__}: {err})") from None


@dataclass
class TrialRecord:
    """One finished trial: what ran, what was seen, what it means.

    As a trials.jsonl line (``to_dict``) it carries ``schema_version`` and its spec once:
    the evidence's copy of the spec is left out and restored on reading (``from_dict``).
    The line's shape is nsadiag/schemas/trial.schema.json. ``spec`` (a RecordSpec),
    ``evidence`` and ``gpu`` (nsadiag.probes.gpu.GpuState) are parsed there, once; a record
    whose evidence is empty has none (None). A record built from a spec's JSON object (the
    harness's, a test's) parses that spec when it is made.

    ``finding`` is the Finding decided once where the command assembles its result
    (nsadiag.finding.run.with_finding, called by `nsadiag run` and nsadiag.watch()), kept
    with the record in record.json so that a report renders it and decides nothing. The
    record is the store and not summary.json: summary.json is redacted and cleaned for
    other tools, while the record holds the run's raw data, which every later render (its
    own redaction included) starts from. None on trials.jsonl lines (a sweep's trials are
    judged together) and on a record.json written before findings were stored, whose
    finding the report decides when it loads it (nsadiag.report.dispatch).
    """

    spec: RecordSpec
    evidence: Evidence | None
    verdict: Verdict
    trial_dir: str
    wall_s: float
    gpu: GpuState | None = None  # NVML state when the runner stopped it
    finding: Finding | None = None

    def __post_init__(self) -> None:
        # a spec handed over as its JSON object (a freshly built record) is parsed here
        if not isinstance(self.spec, RecordSpec):
            self.spec = RecordSpec.from_dict(self.spec)

    @property
    def verdict_name(self) -> VerdictName:
        return self.verdict.name

    @property
    def facts(self) -> VerdictFacts:
        """The verdict's facts (typed; each None when not recorded)."""
        return self.verdict.facts

    @property
    def slow_by(self) -> str | None:
        """Why a SLOW is slow: "size", "defect", or None (not SLOW, or not decided)."""
        return self.facts.slow.slow_by

    def to_dict(self) -> dict[str, Any]:
        evidence = {k: v for k, v in self.evidence.to_dict().items() if k != "spec"} \
            if self.evidence is not None else {}
        stored = {"schema_version": SCHEMA_VERSION, "spec": self.spec.to_dict(),
                  "evidence": evidence, "verdict": self.verdict.to_dict(),
                  "trial_dir": self.trial_dir, "wall_s": self.wall_s,
                  "gpu": gpu_json(self.gpu)}
        if self.finding is not None:
            stored["finding"] = self.finding.to_dict()
        return stored

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        """A record from its JSON form (older records without schema_version, or with the
        spec twice, read too); RecordError naming the first violation of the schema, or a
        schema_version this nsadiag does not read."""
        check_schema_version(data, "trial record")
        current = {**data, "schema_version": SCHEMA_VERSION,
                   "evidence": {k: v for k, v in (data.get("evidence") or {}).items()
                                if k != "spec"} if isinstance(data.get("evidence"), dict)
                   else data.get("evidence")}
        found = errors(current, "trial")
        if found:
            raise RecordError(f"not a trial record ({found[0]})")
        verdict = _verdict_of(data["verdict"])
        finding = _finding_of(data.get("finding"))
        if finding is not None and finding.verdict != verdict.name:
            finding = None  # prose that contradicts the record's verdict: decided again
        return cls(_spec_of(data["spec"]), _evidence_of(data), verdict,
                   data["trial_dir"], float(data["wall_s"]), _gpu_of(data.get("gpu")),
                   finding)


def _spec_of(data: dict[str, Any]) -> RecordSpec:
    """The typed spec of a stored record; RecordError for a field of the wrong type."""
    try:
        return RecordSpec.from_dict(data)
    except TypeError as err:
        raise RecordError(f"not a trial record ({err})") from None


def _finding_of(data: Any) -> Finding | None:
    return stored_finding(data, "not a trial record")


def stored_finding(data: Any, what: str) -> Finding | None:
    """The finding a stored record keeps (its ``finding``: the data, or None when it keeps
    none, written before findings were stored), checked against the shape summary.json
    gives a finding; RecordError, "``what`` (finding ...)" naming the first violation."""
    if data is None:
        return None
    found = definition_errors(data, "summary", "finding")
    if found:
        raise RecordError(f"{what} (finding {found[0]})")
    try:
        finding = Finding.from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        raise RecordError(f"{what} (finding: {type(err).__name__}: {err})") from None
    return finding if follows_its_verdict(finding) else None


def follows_its_verdict(finding: Finding) -> bool:
    """Whether a stored finding's status and headline are what its verdict gives: a
    failure's status is "failure", OK's "healthy" (or a measurement's), INCONCLUSIVE's
    "inconclusive" (the title's mark is the status's; nsadiag.report.top names the verdict
    in it). A received record whose status says otherwise (healthy over an ERROR) is not
    laid out: its finding is decided again from the records (``stored_finding`` gives
    None, as for a record written before findings were stored)."""
    name, status = finding.verdict, finding.status
    if name in TIMING:  # a triage that did not settle one is inconclusive
        healthy = ("healthy",) if finding.kind == "slow by size" else ()
        return status in ("failure", "inconclusive", "regression", *healthy)
    if name in FAILURES:
        return status == "failure"
    if name == VerdictName.OK:
        return status in ("healthy", "regression")
    return status == "measured"  # MEASURED: a memory, trace or stacks command


FINDING_FILE = "finding.json"
"""Where a command whose result is the run directory's trials (the sweeps, ddp, triage)
keeps the finding it decided when it ended: {"finding": ..., and what it was decided
against}."""


def keep_finding(run_dir: Path, finding: Finding, **against: Any) -> Path:
    """Keep ``finding`` in the run directory's FINDING_FILE, with ``against`` (JSON values:
    what it was decided against that a later render must use too), replacing one kept
    before; its schema_version lets an older nsadiag refuse it in one line."""
    return write_json(run_dir / FINDING_FILE, {"schema_version": SCHEMA_VERSION,
                                               "finding": finding.to_dict(), **against})


def forget_finding(run_dir: Path) -> None:
    """Remove the kept FINDING_FILE: a command about to add trials to the run directory
    (a resumed sweep) makes it stale until it keeps a new one."""
    with contextlib.suppress(FileNotFoundError):
        (run_dir / FINDING_FILE).unlink()


def kept_finding_file(run_dir: Path) -> dict[str, Any] | None:
    """The run directory's FINDING_FILE as stored, None when it has none (written by an
    nsadiag that kept no finding there, or by a command that did not end); ValueError
    (one line) when it is unreadable or not a JSON object."""
    path = run_dir / FINDING_FILE
    if not os.path.lexists(path):
        return None
    data = read_json(path, FINDING_FILE)
    if not isinstance(data, dict):
        raise RecordError(f"{FINDING_FILE}: {path} is not a JSON object")
    return data


def _gpu_of(data: Any) -> GpuState | None:
    """The GPU state of a stored record; RecordError for a row of another shape."""
    try:
        return gpu_of(data)
    except (KeyError, TypeError, ValueError) as err:
        raise RecordError(f"not a trial record (gpu: {type(err).__name__}: {err})") from None


def _evidence_of(data: dict[str, Any]) -> Evidence | None:
    """The Evidence of a stored record (the spec restored into it), None when its evidence
    is empty; RecordError when it lacks what every Evidence has or holds a value of the
    wrong type."""
    if not data["evidence"]:
        return None
    try:
        return Evidence.from_dict({**data["evidence"], "spec": data["spec"]})
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise RecordError(f"not a trial record (evidence: {type(err).__name__}: {err})") \
            from None


def _verdict_of(data: dict[str, Any]) -> Verdict:
    """The Verdict of a stored record's verdict (its shape already checked by the schema);
    RecordError for a name that is not a verdict's. Facts left out are read as none."""
    try:
        return Verdict.from_dict(data)
    except ValueError as err:
        raise RecordError(f"not a trial record ({err})") from None


def check_schema_version(data: Any, what: str) -> None:
    """RecordError (one line) when ``data`` is an object whose schema_version is not one
    this nsadiag reads (1 to SCHEMA_VERSION); data without one is read as version 1."""
    if not isinstance(data, dict) or "schema_version" not in data:
        return
    version = data["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int) or \
            not 1 <= version <= SCHEMA_VERSION:
        raise RecordError(f"{what}: schema_version {version!r} is not one this nsadiag reads "
                         f"(1 to {SCHEMA_VERSION}): written by a newer nsadiag, or not by "
                         f"nsadiag")


def default_run_dir(command: str) -> Path:
    """runs/<UTC time>-<command>."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / f"{stamp}-{command}"


# ---- what nsadiag writes there: the manifest ------------------------------------------------

# LOCK_NAME .. written_dir: the manifest, kept with the rule of what nsadiag may remove
# (nsadiag.store.owned); named here too, where the run directory's readers look for it

# ---- the lock -------------------------------------------------------------------------------

_held: dict[str, int] = {}  # resolved run directory -> descriptor holding its lock
_held_lock = threading.Lock()
LOCK_POLL_S = 0.1


def check_out(path: Path | str) -> Path:
    """ValueError (one line) for an empty --out; the path otherwise."""
    if not str(path).strip():
        raise ValueError("out: must name a directory, got ''")
    return Path(path)


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory (or reuse it to resume), prove it is writable, hold its
    lock (see the module docstring), set the disk reserve aside and record what its
    reports will hide (``record_redaction``). ValueError (one line, naming ``path``) when
    it cannot, with no lock file of this process left behind (``_undone_on_failure``).
    A directory that holds files nsadiag did not write, and is not one of its run
    directories, is refused before anything is written (nsadiag.store.owned)."""
    check_claimable(Path(check_out(path)))
    _writable(path)
    with _undone_on_failure(path):
        lock_run_dir(path)
        claim(path)
        reserve_space(path)
        record_redaction(path, sys.argv)
    return path


def prepare_fresh_run_dir(path: Path) -> Path | None:
    """``prepare_run_dir`` for a command that does not resume: an earlier run in ``path``
    is set aside first (``set_aside``; where it went is returned, None when there was
    none), so the new run starts in an empty directory; it is put back when the rest
    fails. Only nsadiag's own files are set aside: the user's files beside a run stay, and
    a directory of the user's that is not a run directory is refused untouched."""
    check_claimable(Path(check_out(path)))
    _writable(path)
    earlier = None
    with _undone_on_failure(path):
        lock_run_dir(path)
        claim(path)
        earlier = set_aside(path)
        try:
            reserve_space(path)
            record_redaction(path, sys.argv)
        except BaseException:
            restore_earlier(path, earlier)
            raise
    return earlier


@contextlib.contextmanager
def _undone_on_failure(path: Path) -> Iterator[None]:
    """When the body fails (a full disk while the lock's pid or redaction.json is
    written): the lock is given up, its file removed when this process created it, and
    the failure is a ValueError (one line) that names ``path``."""
    lock = path / LOCK_NAME
    existed = os.path.lexists(lock)
    try:
        yield
    except (OSError, ValueError) as err:
        if holds(path):
            release_run_dir(path)
            if not existed:
                with contextlib.suppress(OSError):
                    os.unlink(lock)
        if isinstance(err, ValueError) and str(path) in str(err):
            raise
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ValueError(f"out: cannot write to {path}: {why}") from None


def _writable(path: Path) -> None:
    """Create the directory and prove it writable; ValueError (one line) otherwise."""
    check_out(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ValueError(f"out: cannot write to {path}: {err.strerror or err}") from None


def _open_lock(directory: Path) -> int:
    """The lock file's descriptor: a regular file with one link, never followed; a link,
    a FIFO or a hard link planted under its name is removed (only the name) first."""
    lock = directory / LOCK_NAME
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _ in range(3):
        try:
            fd = os.open(lock, flags, 0o644)
        except OSError as err:
            if err.errno != errno.ELOOP:
                raise
            os.unlink(lock)  # a symbolic link: the link goes, its target is untouched
            continue
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            return fd
        os.close(fd)
        os.unlink(lock)
    raise OSError(errno.EEXIST, f"{lock} keeps being replaced")


def lock_run_dir(path: Path, wait_s: float = 0.0) -> None:
    """Hold the lock of an existing run directory for this process (a no-op when it
    already holds it), waiting up to ``wait_s`` while another process holds it; then
    ValueError (one line) naming the holder."""
    key = str(Path(path).resolve())
    with _held_lock:
        if key in _held:
            return
        try:
            fd = _open_lock(Path(key))
        except OSError as err:
            raise ValueError(f"out: cannot write to {path}: {err.strerror or err}") from None
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(LOCK_POLL_S)
                    continue
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ValueError(f"out: {path} is in use by another nsadiag (pid {holder}); wait "
                             f"for it to finish or choose another --out") from None
        _held[key] = fd  # held from here: a failure below gives it up (_undone_on_failure)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def release_run_dir(path: Path) -> None:
    """Give up this process's lock of a run directory (nothing when it holds none)."""
    with _held_lock:
        fd = _held.pop(str(Path(path).resolve()), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor of the lock releases it


def holds(path: Path) -> bool:
    """Whether this process holds the run directory's lock."""
    with _held_lock:
        return str(Path(path).resolve()) in _held


@contextlib.contextmanager
def locked(path: Path, wait_s: float = 0.0) -> Iterator[None]:
    """The run directory's lock held for the body (see ``lock_run_dir``), and given up
    after unless this process held it before."""
    had = holds(path)
    lock_run_dir(path, wait_s)
    try:
        yield
    finally:
        if not had:
            release_run_dir(path)


@contextlib.contextmanager
def discard_on_refusal(path: Path | None) -> Iterator[None]:
    """Remove ``path`` again when the body refuses (raises ValueError) and it created the
    directory without leaving anything but empty directories and nsadiag's private files
    in it (and the parents it created, such as runs/, when they are empty): a rejected
    command leaves nothing behind. A directory that existed before, or holds any other
    file, is kept."""
    created = _missing_parents(path) if path is not None else []
    try:
        yield
    except ValueError:
        if created and path is not None and path.is_dir() and not path.is_symlink() and \
                not any(p.is_file() and p.name not in PRIVATE for p in path.rglob("*")):
            release_run_dir(path)
            shutil.rmtree(path, ignore_errors=True)
            for parent in created[1:]:
                with contextlib.suppress(OSError):
                    parent.rmdir()  # only when empty
        raise


def _missing_parents(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, innermost first."""
    missing = []
    for candidate in [path, *path.parents]:
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    return missing


# ---- writing: never through a planted link --------------------------------------------------


def _umask() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()
"""The mode an ordinary ``open(path, "w")`` would give a new file here."""
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_bytes(path: Path, data: bytes, reserve: bool = True) -> Path:
    """Write a whole file atomically: an exclusive temporary beside it (a fresh name
    created with O_EXCL, so never through a planted link), fsynced, renamed over the name
    (a link of that name is replaced, not followed). Short of space, the directory's
    reserve is given back and the write tried once more (unless ``reserve`` is False: a
    file the verdict does not need). ValueError (one line) when it cannot be written,
    with nothing half-written left."""
    path = Path(path)
    try:
        return _write_once(path, data)
    except OSError as err:
        if reserve and err.errno in _NO_SPACE and give_back_reserve(path.parent):
            with contextlib.suppress(OSError):
                return _write_once(path, data)
        raise ValueError(f"out: cannot write {path}: {err.strerror or err}") from None


def _write_once(path: Path, data: bytes) -> Path:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), FILE_MODE)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_text(path: Path, text: str, reserve: bool = True) -> Path:
    """``write_bytes`` of UTF-8 text, always valid UTF-8: a lone surrogate (an undecodable
    byte of a program's output or exception, kept by ``surrogateescape``) is written as
    U+FFFD, never as the raw byte."""
    return write_bytes(path, valid_utf8(text), reserve)


def valid_utf8(text: str) -> bytes:
    """``text`` as UTF-8, each lone surrogate replaced by U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace") \
            .encode("utf-8")


def write_json(path: Path, data: Any, reserve: bool = True) -> Path:
    """``write_text`` of indented JSON."""
    return write_text(path, json.dumps(data, indent=1) + "\n", reserve)


def write_private_json(path: Path, data: Any) -> Path:
    """``write_json`` readable by this user only (what redaction hides)."""
    write_json(path, data)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o600, follow_symlinks=False)
    return path


def create_file(path: Path) -> IO[bytes]:
    """A new, empty regular file opened for unbuffered writing: whatever had the name
    before (a planted link, an earlier run's file) is removed first, never followed or
    truncated. OSError when it cannot be created."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666)
    return os.fdopen(fd, "wb", buffering=0)


def write_run_meta(run_dir: Path, command_name: str, argv: list[str], **extra: Any) -> Path:
    """run.json: the run's kind (what ``nsadiag report`` renders it as), its argv and
    whatever the kind keeps beside them (the spec, the environment, labels)."""
    record_redaction(run_dir, list(argv))
    return write_json(run_dir / "run.json", {"schema_version": SCHEMA_VERSION,
                                             "command_name": command_name,
                                             "argv": list(argv), **extra})


def record_redaction(run_dir: Path, argv: Sequence[str] = ()) -> None:
    """Store in redaction.json (readable by this user only) what the run's reports hide:
    what this process knows to hide and the values after credential-like flags in
    ``argv`` (nsadiag.redact.record_of_this_process), merged with what it held."""
    stored = stored_redaction(run_dir)
    record = record_of_this_process(argv, stored)
    if record != stored:
        write_private_json(run_dir / REDACTION_NAME, record)


def stored_redaction(run_dir: Path) -> dict[str, Any] | None:
    """What a run recorded for redaction (None when it recorded nothing readable)."""
    path = run_dir / REDACTION_NAME
    if not os.path.lexists(path):
        return None
    try:
        stored = read_json(path, REDACTION_NAME)
    except ValueError:
        return None
    return stored if isinstance(stored, dict) else None


# ---- a reserve of space for the verdict -----------------------------------------------------

RESERVE_BYTES = 4 * 2**20


def reserve_space(run_dir: Path) -> None:
    """Set RESERVE_BYTES aside in ``run_dir`` (best effort: nothing when there is no room
    already, or the file system cannot allocate ahead)."""
    path = run_dir / RESERVE_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError:
        return  # one is there already (it is only ever unlinked), or nothing can be made
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        os.close(fd)


def give_back_reserve(run_dir: Path) -> bool:
    """Remove the reserve of ``run_dir``; whether there was one."""
    try:
        os.unlink(run_dir / RESERVE_NAME)
    except OSError:
        return False
    return True


# ---- reading: only regular files, never through a link --------------------------------------

MAX_JSON_BYTES = 64 * 2**20
"""A stored JSON document (record.json, checks.json, ...) larger than this is refused."""


def open_regular(path: Path, what: str) -> IO[bytes]:
    """``path`` opened for reading when it is a regular file and not a symbolic link;
    ValueError (one line, naming ``what``) otherwise: missing, a link (planted to a file
    outside), a FIFO or device (which could block or never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise ValueError(f"{what}: {path} is a symbolic link; nsadiag reads only the "
                             f"files it wrote there") from None
        raise ValueError(f"{what}: cannot read {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{what}: {path} is not a regular file")
    return os.fdopen(fd, "rb")


MAX_JSON_DEPTH = 100
"""Levels of nesting a stored record may have: nsadiag's own nest 12 deep at most (a run's
record.json with its stacks' frames); a deeper one would be walked by recursive code
(redaction, rendering) into a RecursionError."""


def parse_json(data: bytes | str, what: str, where: Path | str) -> Any:
    """JSON text as a value; ValueError (one line) when it is not JSON or nests deeper
    than MAX_JSON_DEPTH (or too deeply for this interpreter to parse)."""
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what}: {where} is not valid JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{what}: {where} nests too deeply to read") from None
    if _deeper_than(value, MAX_JSON_DEPTH):
        raise ValueError(f"{what}: {where} nests too deeply to read (more than "
                         f"{MAX_JSON_DEPTH} levels)")
    return value


def _deeper_than(value: Any, levels: int) -> bool:
    """Whether a JSON value nests more than ``levels`` deep (walked without recursion)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > levels:
                return True
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children
                           if isinstance(child, (dict, list)))
    return False


def read_json(path: Path, what: str) -> Any:
    """A stored JSON file (see ``open_regular``); ValueError (one line) when it is missing,
    not a regular file, larger than MAX_JSON_BYTES, not JSON, nested too deeply, or of a
    schema_version this nsadiag does not read."""
    with open_regular(path, what) as f:
        data = f.read(MAX_JSON_BYTES + 1)
    if len(data) > MAX_JSON_BYTES:
        raise ValueError(f"{what}: {path} is larger than {MAX_JSON_BYTES // 2**20} MiB")
    value = parse_json(data, what, path)
    check_schema_version(value, what)
    return value


def read_tail(path: Path, max_bytes: int) -> str:
    """The last ``max_bytes`` of a stored text file ('' when it is missing, a link or not
    a regular file)."""
    try:
        with open_regular(path, "file") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - max_bytes))
            return f.read(max_bytes).decode(errors="replace")
    except (ValueError, OSError):
        return ""


# ---- a run that replaces an earlier one -----------------------------------------------------
# set_aside, restore_earlier and drop_earlier move and remove only nsadiag's own entries
# (nsadiag.store.owned); these two name and clear what a killed rerun left set aside.


def left_aside(path: Path) -> list[Path]:
    """Earlier runs of ``path`` that an nsadiag set aside and could not put back or remove
    (it was killed with SIGKILL during a rerun): the ``.nsadiag-earlier-*`` directories in
    it, oldest first; none while another nsadiag holds the directory (its rerun's own)."""
    if not holds(path) and _lock_held(path):
        return []
    return set_aside_runs(path)


def _lock_held(directory: Path) -> bool:
    """Whether another process holds the lock of ``directory`` (a regular lock file only;
    one that cannot be opened counts as held: nothing is removed on a guess)."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK |
                     os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # the lock, when taken, goes with the descriptor


def drop_left_aside(path: Path) -> list[Path]:
    """Remove the earlier runs ``left_aside`` finds (once a new run in ``path`` has its
    verdict; only nsadiag's files in them); those removed."""
    gone = left_aside(path)
    for earlier in gone:
        remove_ours(earlier)
    return gone


# ---- trials.jsonl ---------------------------------------------------------------------------


def next_trial_index(run_dir: Path) -> int:
    """One past the highest trial-N directory: a new trial never reuses an old one's."""
    taken = [int(p.name.split("-", 1)[1]) for p in run_dir.glob("trial-*")
             if p.name.split("-", 1)[1].isdigit()]
    return max(taken, default=-1) + 1


def spec_key(spec: dict[str, Any]) -> str:
    """What identifies a trial for resuming: the spec without its directory."""
    return json.dumps({k: v for k, v in spec.items() if k != "out_dir"}, sort_keys=True)


def append_record(path: Path, record: TrialRecord) -> None:
    """Append one record to trials.jsonl as one whole line and fsync it before anything
    else runs; on a failed write the file is cut back to its old length (no torn record)
    and ValueError names the file. A trials.jsonl that is a link or not a regular file
    with one link is refused, never written through."""
    line = (json.dumps(record.to_dict()) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW |
                     os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise ValueError(f"out: cannot write {path}: {err.strerror or err}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise ValueError(f"out: {path} is not a file nsadiag wrote (a hard link or a "
                             f"special file); refusing to append to it")
        size = info.st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line  # a line torn by a killed writer is ended first
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(28, f"short write ({written} of {len(line)} bytes)")
            os.fsync(fd)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
                os.fsync(fd)
            raise ValueError(f"out: cannot write {path}: {err.strerror or err}") from None
    finally:
        os.close(fd)


MAX_RECORD_BYTES = 16 * 2**20
"""A trials.jsonl line longer than this is skipped unread (a record is kilobytes)."""
MAX_RECORDS_BYTES = 128 * 2**20
"""At most this much of trials.jsonl's records is kept; later lines are skipped."""
_SKIP_CHUNK = 2**20


def _lines(f: IO[bytes], limit: int) -> Iterator[bytes | None]:
    """The lines of a binary file, each at most ``limit`` bytes long (None in place of a
    longer one, which is read past in chunks, never held)."""
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        if len(line) > limit and not line.endswith(b"\n"):
            while True:
                chunk = f.readline(_SKIP_CHUNK)
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield None
            continue
        yield line


def load_records(path: Path, skipped: list[str] | None = None) -> list[TrialRecord]:
    """The records of trials.jsonl, read line by line (see the module docstring). A line
    that is not a whole trial record (torn by a killed writer, malformed, of a newer
    schema, too long) is skipped; with ``skipped`` each is reported there as
    "trials.jsonl line N: why". An interrupted trial run again on a resume is left out
    (the rerun's record stands for it)."""
    if not os.path.lexists(path):
        return []
    records: list[TrialRecord] = []
    kept = 0
    with open_regular(path, "trials.jsonl") as f:
        for number, line in enumerate(_lines(f, MAX_RECORD_BYTES), 1):
            if line is not None and not line.strip():
                continue
            if line is None:
                why = f"longer than {MAX_RECORD_BYTES // 2**20} MiB, not read"
            elif kept + len(line) > MAX_RECORDS_BYTES:
                if skipped is not None:
                    skipped.append(f"{path.name} line {number} and later: past the first "
                                   f"{MAX_RECORDS_BYTES // 2**20} MiB of records, not read")
                break
            else:
                why = _record_of(line, records)
                if why is None:
                    kept += len(line)
                    continue
            if skipped is not None:
                skipped.append(f"{path.name} line {number}: {why}")
    return _without_superseded(records)


def _without_superseded(records: list[TrialRecord]) -> list[TrialRecord]:
    """``records`` less each interrupted trial (``evidence.interrupted``) that a resume
    ran again: a later record of the same spec replaces it."""
    last = {spec_key(r.spec.to_dict()): i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records)
            if not (r.evidence is not None and r.evidence.interrupted and
                    last[spec_key(r.spec.to_dict())] > i)]


def _record_of(line: bytes, records: list[TrialRecord]) -> str | None:
    """Append the record of one trials.jsonl line to ``records``; why it is not one."""
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "torn or not JSON"
    except RecursionError:
        return "nested too deeply to read"
    if _deeper_than(data, MAX_JSON_DEPTH):
        return f"nested more than {MAX_JSON_DEPTH} levels deep"
    try:
        records.append(TrialRecord.from_dict(data))
    except (ValueError, TypeError, AttributeError) as err:
        return str(err)
    return None
