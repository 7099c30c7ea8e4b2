"""The run directory: where a command keeps what it ran and what it found.

    runs/<UTC time>-<command>/
        run.json        the run's kind (command_name), its argv, the environment
        spec.json       the base trial spec
        trials.jsonl    one TrialRecord per finished trial, appended and fsynced in order
        trial-<n>/      a trial's own files (spec, heartbeat events, stacks, result)
        report.md, summary.json, plots

One nsadiag at a time per run directory: ``prepare_run_dir`` takes an exclusive
``flock`` on ``.nsadiag.lock`` in it and holds it until the process exits (or
``release_run_dir``); a second process preparing the same directory gets a one-line
ValueError naming the holder's pid. The kernel drops the lock when its holder dies, however
it dies (``kill -9`` included), so a stale lock file never blocks a later run; the lock's
descriptor is close-on-exec, so children started by the holder do not keep it.

A rerun of the same command in the same directory resumes: a trial whose spec (without its
directory) is already recorded is not run again (``spec_key``), and new trial directories
are numbered past the highest existing one (``next_trial_index``).

trials.jsonl is never left with a torn record by nsadiag: a record is one line written by
one ``write`` on an O_APPEND descriptor and fsynced; a write that fails part-way (a full
disk) is cut off again before the error is raised. A line torn by something else (a
killed writer, a copy cut short) or a record that is not a trial record is skipped by
``load_records`` and reported to its ``skipped`` list. A file that cannot be written
raises ValueError with one line naming it.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsadiag.schema import SCHEMA_VERSION, errors


@dataclass
class TrialRecord:
    """One finished trial: what ran, what was seen, what it means.

    As a trials.jsonl line (``to_dict``) it carries ``schema_version`` and its spec once:
    the evidence's copy of the spec is left out and restored on reading (``from_dict``).
    The line's shape is nsadiag/schemas/trial.schema.json.
    """

    spec: dict[str, Any]
    evidence: dict[str, Any]
    verdict: dict[str, Any]
    trial_dir: str
    wall_s: float
    gpu: list[dict[str, Any]] | str | None = None  # NVML state when the runner stopped it

    @property
    def verdict_name(self) -> str:
        return self.verdict["name"]

    def to_dict(self) -> dict[str, Any]:
        evidence = {k: v for k, v in self.evidence.items() if k != "spec"}
        return {"schema_version": SCHEMA_VERSION, "spec": self.spec, "evidence": evidence,
                "verdict": self.verdict, "trial_dir": self.trial_dir, "wall_s": self.wall_s,
                "gpu": self.gpu}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        """A record from its JSON form (older records without schema_version, or with the
        spec twice, read too); ValueError naming the first violation of the schema."""
        current = {**data, "schema_version": SCHEMA_VERSION,
                   "evidence": {k: v for k, v in (data.get("evidence") or {}).items()
                                if k != "spec"} if isinstance(data.get("evidence"), dict)
                   else data.get("evidence")}
        found = errors(current, "trial")
        if found:
            raise ValueError(f"not a trial record ({found[0]})")
        evidence = {**data["evidence"], "spec": data["spec"]}
        return cls(data["spec"], evidence, data["verdict"], data["trial_dir"],
                   float(data["wall_s"]), data.get("gpu"))


def default_run_dir(command: str) -> Path:
    """runs/<UTC time>-<command>."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / f"{stamp}-{command}"


LOCK_NAME = ".nsadiag.lock"
_held: dict[str, int] = {}  # resolved run directory -> descriptor holding its lock
_held_lock = threading.Lock()


def check_out(path: Path | str) -> Path:
    """ValueError (one line) for an empty --out; the path otherwise."""
    if not str(path).strip():
        raise ValueError("out: must name a directory, got ''")
    return Path(path)


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory (or reuse it to resume), prove it is writable and hold
    its lock (see the module docstring)."""
    check_out(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ValueError(f"out: cannot write to {path}: {err.strerror or err}") from None
    lock_run_dir(path)
    return path


def lock_run_dir(path: Path) -> None:
    """Hold the lock of an existing run directory for this process (a no-op when it
    already holds it); ValueError (one line) while another process holds it."""
    key = str(Path(path).resolve())
    with _held_lock:
        if key in _held:
            return
        try:
            fd = os.open(Path(key) / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise ValueError(f"out: cannot write to {path}: {err.strerror or err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ValueError(f"out: {path} is in use by another nsadiag (pid {holder}); wait "
                             f"for it to finish or choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held[key] = fd


def release_run_dir(path: Path) -> None:
    """Give up this process's lock of a run directory (nothing when it holds none)."""
    with _held_lock:
        fd = _held.pop(str(Path(path).resolve()), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor of the lock releases it
@contextlib.contextmanager
def discard_on_refusal(path: Path | None) -> Iterator[None]:
    """Remove ``path`` again when the body refuses (raises ValueError) and it created the
    directory without leaving anything but empty directories in it: a rejected command
    leaves nothing behind. A directory that existed before, or holds any file, is kept."""
    existed = path is None or path.exists()
    try:
        yield
    except ValueError:
        if not existed and path is not None and path.is_dir() and \
                not any(p.is_file() for p in path.rglob("*")):
            shutil.rmtree(path, ignore_errors=True)
        raise


def write_text(path: Path, text: str) -> Path:
    """Write a whole file atomically (a temporary beside it, fsynced, renamed over it);
    ValueError (one line) when it cannot be written, with nothing half-written left."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ValueError(f"out: cannot write {path}: {err.strerror or err}") from None
    return path


def write_json(path: Path, data: Any) -> Path:
    """``write_text`` of indented JSON."""
    return write_text(path, json.dumps(data, indent=1) + "\n")


def write_run_meta(run_dir: Path, command_name: str, argv: list[str], **extra: Any) -> Path:
    """run.json: the run's kind (what ``nsadiag report`` renders it as), its argv and
    whatever the kind keeps beside them (the spec, the environment, labels)."""
    return write_json(run_dir / "run.json", {"schema_version": SCHEMA_VERSION,
                                             "command_name": command_name,
                                             "argv": list(argv), **extra})


def read_json(path: Path, what: str) -> Any:
    """A JSON file; ValueError (one line) when it is missing, unreadable or not JSON."""
    try:
        return json.loads(path.read_text())
    except OSError as err:
        raise ValueError(f"{what}: cannot read {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}: {path} is not valid JSON ({err})") from None


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
    and ValueError names the file."""
    line = (json.dumps(record.to_dict()) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as err:
        raise ValueError(f"out: cannot write {path}: {err.strerror or err}") from None
    try:
        size = os.fstat(fd).st_size
        if size and _last_byte(path, size) != b"\n":
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


def _last_byte(path: Path, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(size - 1)
        return f.read(1)


def load_records(path: Path, skipped: list[str] | None = None) -> list[TrialRecord]:
    """The records of trials.jsonl. A line that is not a whole trial record (torn by a
    killed writer, or malformed) is skipped; with ``skipped`` each is reported there as
    "trials.jsonl line N: why"."""
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(TrialRecord.from_dict(json.loads(line)))
        except json.JSONDecodeError:
            why = "torn or not JSON"
        except (ValueError, TypeError, AttributeError) as err:
            why = str(err)
        else:
            continue
        if skipped is not None:
            skipped.append(f"{path.name} line {number}: {why}")
    return records
