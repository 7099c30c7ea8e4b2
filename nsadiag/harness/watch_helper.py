"""The watch of ``nsadiag.watch()``: a process it did not start, watched from another
process (the helper, ``python -m nsadiag.commands.watch``), never killed.

``watch_block(pid, run_dir, stall_timeout_s, deadline_s, on_record)`` runs the helper's
watch. PID is the watched process (the caller of ``nsadiag.watch()``), which writes its
heartbeat into ``RUN_DIR/proc-<PID>/`` (nsadiag.harness.watched). Stdin is the read end of
a pipe whose only write end is in PID: end of file means the watched block ended (PID then
wrote ``block.json``) or PID died.

The watching happens here, not in a thread of PID: a thread of PID stops whenever PID's
interpreter does (a C extension holding the GIL, a process stopped by a signal), and a
stack sampler cannot ptrace its own process. It is the one parent loop of every diagnosis
(nsadiag.harness.session) over PID's stream, and what it finds is decided and recorded as
``nsadiag run`` records a command (nsadiag.harness.record):

stall     no progress for stall_timeout_s: PID's stacks over a window (py-spy, or
          faulthandler's dump on SIGUSR1, which the heartbeat armed), its CPU time, GPU
          state -> STALL-BUSY / DEADLOCK / STALL-COLLECTIVE, recorded at once, while PID
          still hangs;
deadline  deadline_s of wall time (0: none) while PID still progresses -> SLOW;
end       the block ended first: OK, or ERROR with the exception it raised.

Each becomes one TrialRecord passed to ``on_record`` (which writes the report). The first
verdict stands: after a stall or the deadline the helper waits for the block to end and
records nothing more (``block.json`` says how it ended). The record's outcome reads as
"stopped by the runner" for the verdict rules; nothing is stopped.
"""

from __future__ import annotations

import json
import math
import os
import select
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from nsadiag.evidence import ProcessOutcome
from nsadiag.harness.record import build_record, command_facts
from nsadiag.harness.session import SessionEnd, Tree, watch_session
from nsadiag.harness.streams import UNBOUNDED_STEPS, Stream
from nsadiag.harness.times import WatchTimes
from nsadiag.rundir import TrialRecord


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


class _BlockTree(Tree):
    """The watched process: one stream, running until the pipe from it closes or it dies,
    never stopped."""

    def __init__(self, pid: int, run_dir: Path, pipe_fd: int):
        super().__init__([Stream(f"proc-{pid}", run_dir / f"proc-{pid}" / "events.jsonl",
                                 UNBOUNDED_STEPS)])
        self.pid, self.pipe_fd = pid, pipe_fd
        self.closed = False

    def running(self) -> bool:
        return not self.closed and _alive(self.pid)

    def wait(self, seconds: float) -> None:
        readable, _, _ = select.select([self.pipe_fd], [], [], seconds)
        if readable and not os.read(self.pipe_fd, 4096):
            self.closed = True  # the block ended, or the watched process is gone


def _outcome(end: SessionEnd, block_ok: bool) -> ProcessOutcome:
    """The block's outcome: stopped by the runner at a stall or the deadline (nothing was
    stopped: the rules read the first verdict so), else exit code 0 when the block ended
    well."""
    if end.due is not None:
        return ProcessOutcome(exit_code=None, killed_by_runner=True, kill_reason=end.reason,
                              wall_s=end.wall_s, ended_at=end.ended_at)
    return ProcessOutcome(exit_code=0 if block_ok else None, wall_s=end.wall_s,
                          ended_at=end.ended_at)


def watch_block(pid: int, run_dir: Path, stall_timeout_s: float, deadline_s: float,
                on_record: Callable[[TrialRecord], None], pipe_fd: int = 0) -> None:
    """The helper's watch (see the module docstring); ``pipe_fd`` is the pipe from PID."""
    times = WatchTimes(stall_timeout_s, deadline_s if deadline_s > 0 else math.inf)
    tree = _BlockTree(pid, run_dir, pipe_fd)
    end = watch_session(tree, times)
    block_ok = False
    if end.due is None:
        block = _read_json(run_dir / "block.json")
        if block is None and _alive(pid):
            block = {"status": "error"}  # the pipe closed without the block's end
        block_ok = bool(block) and block.get("status") == "ok"
    main = end.streams[0] if end.streams else None
    argv = (main.last[0].get("argv") if main and main.last else None) or []
    spec = {"command": list(argv), "stall_timeout_s": stall_timeout_s,
            "deadline_s": deadline_s or None, "kind": "watch",
            "subject": "the watched block", "pid": pid}
    outcome = _outcome(end, block_ok)
    on_record(build_record(spec, run_dir, end, main, {}, outcome, ended_ok=block_ok,
                           total_steps=main.counts.get("step", 0) if main and block_ok
                           else 0, command=command_facts(end, main, outcome)))
    while tree.running():  # the first verdict stands: wait for the block to end
        tree.wait(times.poll_s)
