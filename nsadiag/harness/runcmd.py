"""`nsadiag run -- CMD`: the user's own command, unchanged, watched to a verdict.

``run_command(argv, run_dir, stall_timeout_s, deadline_s)`` starts the command in a
session of its own with ``nsadiag/harness/inject`` first on PYTHONPATH and
NSADIAG_RUN_DIR set, so every Python process it starts (``python train.py``, ``python -m
pkg``, torchrun and each of its ranks) writes its own heartbeat into
``<run_dir>/proc-<pid>/`` (nsadiag.harness.watched). The command's stdout and stderr pass
through to the terminal and are kept in ``stdout.txt`` and ``stderr.txt``.

The one watcher (nsadiag.harness.watch) follows every process's stream as it appears,
with the stall clock on progress of any of them. On a stall every watched process is
sampled at once (nsadiag.harness.jobs.capture_all) before the whole tree is killed; at
``deadline_s`` (the user's own job timeout) a progressing run is SLOW with its rate and
time per step, never a hang because a timer fired. A command that exits by itself gets
OK for exit code 0, else the exit code's verdict. The record names the training process
(the one with the most heartbeat events) and the evidence of every process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from nsadiag.evidence import Evidence
from nsadiag.harness.jobs import (
    Launched,
    capture_all,
    machine_load,
    outcome_of,
    profile_summary,
)
from nsadiag.harness.watch import Stream, Watcher
from nsadiag.probes.gpu import gpu_state
from nsadiag.rundir import TrialRecord
from nsadiag.verdict.rules import decide

INJECT = Path(__file__).resolve().parent / "inject"
POLL_S = 0.25
UNBOUNDED_STEPS = 2**62  # a user's run has no step count: it ends when the command does


def command_env(run_dir: Path) -> dict[str, str]:
    """This environment, with the injected sitecustomize and nsadiag itself importable
    first and the run directory named."""
    package_root = str(Path(__file__).resolve().parents[2])
    path = [str(INJECT), package_root] + [p for p in os.environ.get("PYTHONPATH", "")
                                          .split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path),
            "NSADIAG_RUN_DIR": str(run_dir.resolve()), "PYTHONUNBUFFERED": "1"}


class _Tee(threading.Thread):
    """Copies one pipe of the command to the terminal and to a file, as it comes."""

    def __init__(self, pipe: IO[bytes], terminal: IO[bytes], path: Path):
        super().__init__(daemon=True)
        self.pipe, self.terminal, self.path = pipe, terminal, path

    def run(self) -> None:
        with open(self.path, "wb") as kept:
            for chunk in iter(lambda: self.pipe.read1(65536), b""):
                kept.write(chunk)
                kept.flush()
                try:
                    self.terminal.write(chunk)
                    self.terminal.flush()
                except (OSError, ValueError):
                    continue  # a closed terminal must not stop the copy to the file


class _Command(Launched):
    """The user's command with its output passed through and kept."""

    def __init__(self, argv: list[str], env: dict[str, str], run_dir: Path):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, start_new_session=True)
        self.pid = self.proc.pid
        self.seen = {}
        self.tees = [_Tee(self.proc.stdout, sys.stdout.buffer, run_dir / "stdout.txt"),
                     _Tee(self.proc.stderr, sys.stderr.buffer, run_dir / "stderr.txt")]
        for tee in self.tees:
            tee.start()

    def finish(self) -> None:
        for tee in self.tees:
            tee.join(timeout=5)


def _new_streams(run_dir: Path, watcher: Watcher, known: set[str]) -> None:
    for path in sorted(run_dir.glob("proc-*/events.jsonl")):
        name = path.parent.name
        if name not in known:
            known.add(name)
            watcher.add_stream(Stream(name, path, UNBOUNDED_STEPS))


def run_command(argv: list[str], run_dir: Path, stall_timeout_s: float,
                deadline_s: float) -> TrialRecord:
    """Run ``argv`` to its verdict (see the module docstring)."""
    if not argv:
        raise ValueError("command: give the command to run after --, e.g. "
                         "nsadiag run -- python train.py")
    if shutil.which(argv[0]) is None and not Path(argv[0]).exists():
        raise ValueError(f"command: {argv[0]!r} not found")
    run_dir.mkdir(parents=True, exist_ok=True)
    for earlier in run_dir.glob("proc-*"):  # an earlier run's processes are not this one's
        shutil.rmtree(earlier, ignore_errors=True)
    watcher = Watcher([], stall_timeout_s, deadline_s)
    known: set[str] = set()
    load_before = machine_load()
    command = _Command(argv, command_env(run_dir), run_dir)
    started = time.time()
    due, stalls, gpu, decided_at = None, {}, None, None
    try:
        while command.poll() is None:
            _new_streams(run_dir, watcher, known)
            watcher.read()
            due = watcher.due()
            if due is not None:
                decided_at = time.time()  # capturing takes seconds and pauses the processes
                pids = {s.name: s.pid for s in watcher.streams if s.pid}
                dirs = {s.name: s.path.parent for s in watcher.streams}
                stalls = capture_all(pids, dirs, due, stall_timeout_s)
                gpu = gpu_state()
                break
            time.sleep(POLL_S)
    finally:
        ended_at = decided_at or time.time()
        command.kill_all()
        command.finish()
    _new_streams(run_dir, watcher, known)
    watcher.read()
    return _record(argv, run_dir, watcher, command.proc.returncode, due, stalls, gpu,
                   started, ended_at, load_before, stall_timeout_s, deadline_s)


def last_traceback(stderr: str) -> dict[str, Any] | None:
    """The last Python traceback in a command's stderr as the exception the verdict rules
    read ({"type", "message", "traceback"}), None when there is none."""
    start = stderr.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    lines = stderr[start:].splitlines()
    frames_end = next((i for i in range(1, len(lines)) if lines[i] and
                       not lines[i].startswith(" ")), None)
    if frames_end is None:
        return None
    kind, _, message = lines[frames_end].partition(":")
    if not kind or " " in kind.strip():
        return None
    return {"type": kind.strip().rsplit(".", 1)[-1], "message": message.strip(),
            "traceback": "\n".join(lines[:frames_end + 1])}


def _result(returncode: int | None, due: Any, steps: int, run_dir: Path
            ) -> dict[str, Any] | None:
    """What the command's end says: ok for exit code 0, the exception of a Python
    traceback on stderr for a failure, nothing else."""
    if due is not None:
        return None
    if returncode == 0:
        return {"status": "ok", "steps_done": steps}
    try:
        exception = last_traceback((run_dir / "stderr.txt").read_text(errors="replace"))
    except OSError:
        exception = None
    return {"status": "error", "exception": exception} if exception else None


def _training_stream(streams: list[Stream]) -> Stream | None:
    """The process that trained: the most heartbeat events besides pulses."""
    def weight(stream: Stream) -> int:
        return sum(n for kind, n in stream.counts.items() if kind != "pulse")

    return max(streams, key=weight, default=None)


def _record(argv: list[str], run_dir: Path, watcher: Watcher, returncode: int | None,
            due: Any, stalls: dict[str, Any], gpu: Any, started: float, ended_at: float,
            load_before: dict[str, Any], stall_timeout_s: float,
            deadline_s: float) -> TrialRecord:
    reason = "budget" if due is not None and due.reason == "budget" else (
        due.reason if due is not None else None)
    outcome = outcome_of(returncode, reason, ended_at - started, ended_at, None)
    main = _training_stream(watcher.streams)
    steps = main.counts.get("step", 0) if main else 0
    result = _result(returncode, due, steps, run_dir)
    spec = {"command": list(argv), "stall_timeout_s": stall_timeout_s,
            "deadline_s": deadline_s}
    evidence = Evidence(
        spec=spec, events=list(main.last) if main else [],
        event_counts=dict(main.counts) if main else {}, result=result, outcome=outcome,
        stall=stalls.get(main.name) if main else None, expected_events_per_step=None,
        total_steps=steps if returncode == 0 else 0, stall_timeout_s=stall_timeout_s,
        pulses=list(main.pulses) if main else [],
        load={"start": load_before, "end": machine_load()},
        profile=profile_summary(main.path.parent / "profile.json") if main else None)
    verdict = decide(evidence)
    data = evidence.to_dict()
    data["processes"] = [{"name": s.name, "pid": s.pid, "events": dict(s.counts),
                          "stall": stalls[s.name].to_dict() if s.name in stalls else None}
                         for s in watcher.streams]
    data["main_process"] = main.name if main else None
    data["exit_code"] = returncode
    (run_dir / "evidence.json").write_text(json.dumps(data, indent=1))
    return TrialRecord(spec=spec, evidence=data, verdict=verdict.to_dict(),
                       trial_dir=str(run_dir), wall_s=ended_at - started, gpu=gpu)
