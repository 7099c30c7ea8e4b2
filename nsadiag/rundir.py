"""The run directory: where a command keeps what it ran and what it found.

    runs/<UTC time>-<command>/
        run.json        the command, its argv and the environment
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
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class TrialRecord:
    """One finished trial: what ran, what was seen, what it means."""

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
        return {"spec": self.spec, "evidence": self.evidence, "verdict": self.verdict,
                "trial_dir": self.trial_dir, "wall_s": self.wall_s, "gpu": self.gpu}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        return cls(data["spec"], data["evidence"], data["verdict"], data["trial_dir"],
                   float(data["wall_s"]), data.get("gpu"))


def default_run_dir(command: str) -> Path:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / f"{stamp}-{command}"


LOCK_NAME = ".nsadiag.lock"
_held: dict[str, int] = {}  # resolved run directory -> descriptor holding its lock
_held_lock = threading.Lock()


def prepare_run_dir(path: Path) -> Path:
    """Create the run directory (or reuse it to resume), prove it is writable and hold
    its lock (see the module docstring)."""
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


def next_trial_index(run_dir: Path) -> int:
    """One past the highest trial-N directory: a new trial never reuses an old one's."""
    taken = [int(p.name.split("-", 1)[1]) for p in run_dir.glob("trial-*")
             if p.name.split("-", 1)[1].isdigit()]
    return max(taken, default=-1) + 1


def spec_key(spec: dict[str, Any]) -> str:
    """What identifies a trial for resuming: the spec without its directory."""
    return json.dumps({k: v for k, v in spec.items() if k != "out_dir"}, sort_keys=True)


def append_record(path: Path, record: TrialRecord) -> None:
    """Append one record to trials.jsonl and fsync it before anything else runs."""
    torn = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with open(path, "a") as f:
        # a line torn by a killed writer is ended first, or it would swallow this record
        f.write(("\n" if torn else "") + json.dumps(record.to_dict()) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_records(path: Path) -> list[TrialRecord]:
    """The records of trials.jsonl; a torn last line (killed writer) is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(TrialRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, KeyError):
            continue
    return records
