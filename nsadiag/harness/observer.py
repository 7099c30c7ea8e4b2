"""The watch of ``nsadiag.watch()``: a process it did not start, watched from another
process (the helper, ``python -m nsadiag.commands.watch``), never killed.

``observe(pid, run_dir, stall_timeout_s, deadline_s, on_record)`` runs the helper's loop.
PID is the watched process (the caller of ``nsadiag.watch()``), which writes its heartbeat
into ``RUN_DIR/proc-<PID>/`` (nsadiag.harness.watched). Stdin is the read end of a pipe
whose only write end is in PID: end of file means the watched block ended (PID then wrote
``block.json``) or PID died.

The watching happens here, not in a thread of PID: a thread of PID stops whenever PID's
interpreter does (a C extension holding the GIL, a process stopped by a signal), and a
stack sampler cannot ptrace its own process. The loop is the one watcher of every
diagnosis (nsadiag.harness.watch) over PID's stream, and what it finds is decided and
reported as ``nsadiag run`` reports a command (nsadiag.harness.runcmd.build_record):

stall     no progress for stall_timeout_s: PID's stacks over a window (py-spy, or
          faulthandler's dump on SIGUSR1, which the heartbeat armed), its CPU time, GPU
          state -> STALL-BUSY / DEADLOCK / STALL-COLLECTIVE, recorded at once, while PID
          still hangs;
deadline  deadline_s of wall time (0: none) while PID still progresses -> SLOW;
end       the block ended first: OK, or ERROR with the exception it raised.

Each becomes one TrialRecord passed to ``on_record`` (which writes the report). The first
verdict stands: after a stall or the deadline nothing is recorded again when the block
ends later (``block.json`` says how it ended). The record's outcome reads as "stopped by
the runner" for the verdict rules; nothing is stopped.
"""

from __future__ import annotations

import json
import math
import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from nsadiag.evidence import ProcessOutcome
from nsadiag.harness.jobs import capture_all, machine_load
from nsadiag.harness.runcmd import build_record
from nsadiag.harness.watch import Stream, Watcher
from nsadiag.probes.gpu import gpu_state
from nsadiag.rundir import TrialRecord
from nsadiag.spec import WATCH_POLL_S

UNBOUNDED_STEPS = 2**62


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Observer:
    """The watch of one process (see the module docstring)."""

    def __init__(self, pid: int, run_dir: Path, stall_timeout_s: float, deadline_s: float,
                 on_record: Callable[[TrialRecord], None]):
        self.pid, self.run_dir, self.on_record = pid, run_dir, on_record
        self.stall_timeout_s = stall_timeout_s
        self.deadline_s = deadline_s
        self.stream = Stream(f"proc-{pid}", run_dir / f"proc-{pid}" / "events.jsonl",
                             UNBOUNDED_STEPS)
        self.watcher = Watcher([self.stream], stall_timeout_s,
                               deadline_s if deadline_s > 0 else math.inf)
        self.started = time.time()
        self.load_before = machine_load()
        self.decided = False

    def spec(self) -> dict[str, Any]:
        argv = (self.stream.last[0].get("argv") if self.stream.last else None) or []
        return {"command": list(argv), "stall_timeout_s": self.stall_timeout_s,
                "deadline_s": self.deadline_s or None, "kind": "watch",
                "subject": "the watched block", "pid": self.pid}

    def step(self) -> None:
        """Read new events; on a stall or the deadline, capture and report."""
        self.watcher.read()
        due = self.watcher.due()
        if due is None or self.decided:
            return
        decided_at = time.time()
        stalls = capture_all({self.stream.name: self.pid},
                             {self.stream.name: self.stream.path.parent}, due,
                             self.stall_timeout_s)
        gpu = gpu_state()
        self.watcher.read()
        outcome = ProcessOutcome(exit_code=None, killed_by_runner=True,
                                 kill_reason=due.reason, wall_s=decided_at - self.started,
                                 ended_at=decided_at)
        self._report(outcome, stalls, gpu, ended_ok=False)

    def finish(self) -> None:
        """The block ended (or the process died) before any verdict: report how."""
        self.watcher.read()
        if self.decided:
            return
        block = _read_json(self.run_dir / "block.json")
        ended = time.time()
        if block is None and _alive(self.pid):
            block = {"status": "error"}  # the pipe closed without the block's end
        ok = bool(block) and block.get("status") == "ok"
        outcome = ProcessOutcome(exit_code=0 if ok else None, wall_s=ended - self.started,
                                 ended_at=ended)
        self._report(outcome, {}, None, ended_ok=ok)

    def _report(self, outcome: ProcessOutcome, stalls: dict[str, Any], gpu: Any,
                ended_ok: bool) -> None:
        record = build_record(self.spec(), self.run_dir, [self.stream], outcome, stalls, gpu,
                              {"start": self.load_before, "end": machine_load()}, ended_ok)
        self.decided = True
        self.on_record(record)


def observe(pid: int, run_dir: Path, stall_timeout_s: float, deadline_s: float,
            on_record: Callable[[TrialRecord], None]) -> None:
    """The helper's loop (see the module docstring); stdin is the pipe from PID."""
    observer = Observer(pid, run_dir, stall_timeout_s, deadline_s, on_record)
    while True:
        readable, _, _ = select.select([0], [], [], WATCH_POLL_S)
        if readable and not os.read(0, 4096):
            break  # the block ended, or the watched process is gone
        if not _alive(pid):
            break
        observer.step()
    observer.finish()
