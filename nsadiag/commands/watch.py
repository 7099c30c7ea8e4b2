"""``nsadiag.watch()``: code nsadiag cannot launch (a notebook, a custom launcher) watched
in its own process, with the heartbeat, sampler and collective counter of ``nsadiag run``
and the same verdicts and report, without stopping it.

    import nsadiag

    with nsadiag.watch(out="runs/x", stall_timeout=60) as watched:
        train()
    print(watched.verdict, watched.report)

Entering the block takes the run directory's lock (nsadiag.rundir), starts this process's
heartbeat into ``out/proc-<pid>/`` (nsadiag.harness.watched: module and step events of the
model being trained, sampler pulses, collectives, faulthandler on SIGUSR1) and starts the
helper process (``python -m nsadiag.commands.watch``) that watches it (see
nsadiag.harness.watch_helper for why a process and not a thread). This process then lets the
helper ptrace it (Yama's PR_SET_PTRACER), so py-spy can sample it where ptrace is limited
to descendants.

On a stall (no progress for ``stall_timeout`` seconds) the helper samples this process's
stacks and CPU and writes the report while the block still hangs; at ``deadline`` seconds
(None: no deadline) a block that still progresses is SLOW; a block that ends first is OK,
or ERROR with the exception it raised (the exception still propagates). The first verdict
stands. A verdict reached while the block still runs is announced once, where the user
looks: one line on ``sys.stderr`` as it is then (a terminal, or in a notebook the cell's
output), ``nsadiag.watch: <headline> (report: out/report.md)``, printed by a thread of
this process that waits for it (a block stuck in a lock, a sleep, a Python loop or a
native op that lets go of the GIL; one that holds the GIL keeps every thread from
printing). The start-up grace of the stall clock covers starting up only: until the first
forward, a main thread that waits (a lock, a queue) rather than imports or builds a
model is a stall after ``stall_timeout`` (nsadiag.harness.streams).

Leaving the block removes every hook and handler, ends the helper (it writes its last
report first) and releases the lock; nothing of the process is stopped or killed.

Files in ``out``: run.json, proc-<pid>/ (events.jsonl, profile.json, faulthandler.txt,
result.json on an exception), block.json (how the block ended), evidence.json,
record.json, report.md, summary.json, watch-helper.txt (the helper's stderr).
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nsadiag.finding.run import with_finding
from nsadiag.harness.helpers import helper_popen
from nsadiag.harness.watch_helper import watch_block
from nsadiag.harness.watched import ProcessHeartbeat, disarm_faulthandler, process_dir, start
from nsadiag.report.dispatch import render_record
from nsadiag.rundir import (
    TrialRecord,
    prepare_run_dir,
    release_run_dir,
    write_json,
    write_run_meta,
)
from nsadiag.spec import STALL_TIMEOUT_S

PR_SET_PTRACER = 0x59616D61
ANNOUNCE_POLL_S = 0.25
HELPER_EXIT_S = 120.0
"""How long leaving the block waits for the helper's last report (a stall capture in
progress takes seconds)."""
EARLIER = ("block.json", "evidence.json", "record.json", "report.md", "summary.json")


def allow_ptrace(pid: int) -> None:
    """Let `pid` and its descendants ptrace this process under Yama's ptrace_scope 1; a
    no-op without Yama."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, pid, 0, 0, 0)
    except (OSError, AttributeError):
        pass


class WatchedBlock:
    """The context manager ``nsadiag.watch()`` returns (see the module docstring).
    ``verdict`` and ``headline`` are None until a verdict is written (during the block
    after a stall, or once it ends); ``report`` is report.md's path."""

    def __init__(self, out: str | Path, stall_timeout: float = STALL_TIMEOUT_S,
                 deadline: float | None = None, no_redact: bool = False):
        if not stall_timeout > 0:
            raise ValueError(f"stall_timeout: must be > 0 seconds, got {stall_timeout!r}")
        if deadline is not None and not deadline > 0:
            raise ValueError(f"deadline: must be > 0 seconds or None, got {deadline!r}")
        self.out = Path(out)
        self.stall_timeout, self.deadline, self.no_redact = stall_timeout, deadline, no_redact
        self.report = self.out / "report.md"
        self.watched: ProcessHeartbeat | None = None
        self.helper: subprocess.Popen | None = None
        self.write_fd: int | None = None
        self.faulthandler_was_enabled = False
        self.block_ended = threading.Event()
        self.announced: str | None = None  # the line printed during the block
        self.announcer: threading.Thread | None = None

    @property
    def summary(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.out / "summary.json").read_text())
        except (OSError, ValueError):
            return None

    @property
    def verdict(self) -> str | None:
        return (self.summary or {}).get("verdict")

    @property
    def headline(self) -> str | None:
        return (self.summary or {}).get("headline")

    def __enter__(self) -> WatchedBlock:
        if self.watched is not None:
            raise ValueError("watch: this block is already being watched")
        prepare_run_dir(self.out)
        for name in EARLIER:  # an earlier watch's verdict is not this one's
            (self.out / name).unlink(missing_ok=True)
        shutil.rmtree(process_dir(self.out), ignore_errors=True)
        self.faulthandler_was_enabled = faulthandler.is_enabled()
        self.watched = start(self.out, job="watch")
        if self.watched is None:
            release_run_dir(self.out)
            raise ValueError(f"out: cannot write to {process_dir(self.out)}")
        write_run_meta(self.out, "watch", list(sys.argv), pid=os.getpid(),
                       stall_timeout_s=self.stall_timeout, deadline_s=self.deadline)
        self._start_helper()
        self.block_ended.clear()
        self.announcer = threading.Thread(target=self._announce, daemon=True,
                                          name="nsadiag-watch-announce")
        self.announcer.start()
        return self

    def _announce(self) -> None:
        """Print the first verdict the helper writes while the block runs, once."""
        while not self.block_ended.wait(ANNOUNCE_POLL_S):
            if self._announce_now():
                return

    def _announce_now(self) -> bool:
        headline = self.headline
        if headline is None or self.announced is not None:
            return headline is not None
        self.announced = f"nsadiag.watch: {headline} (report: {self.report})"
        try:
            print(self.announced, file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):
            pass  # a closed or missing stderr: the report is written all the same
        return True

    def _start_helper(self) -> None:
        read_fd, self.write_fd = os.pipe()  # only this process holds the write end
        # the helper itself is not watched; it runs away from the user's directory
        # (nsadiag.harness.helpers), so the run directory is handed to it absolute
        started = helper_popen("nsadiag.commands.watch", str(os.getpid()),
                               str(self.out.resolve()), str(self.stall_timeout),
                               str(self.deadline or 0), "1" if self.no_redact else "0",
                               drop=("NSADIAG_RUN_DIR",))
        try:
            with open(self.out / "watch-helper.txt", "wb") as log:
                self.helper = subprocess.Popen(
                    **started, stdin=read_fd, stdout=subprocess.DEVNULL, stderr=log,
                    start_new_session=True)  # Ctrl-C in a terminal must not end it
        finally:
            os.close(read_fd)
        allow_ptrace(self.helper.pid)

    def __exit__(self, kind: Any, value: BaseException | None, traceback: Any) -> bool:
        watched = self.watched
        if watched is None:
            return False
        self.block_ended.set()
        self.announcer.join(timeout=5)
        self._announce_now()  # a verdict written just before the block ended
        if value is not None:
            watched.record_exception(value)
        block = {"status": "ok" if value is None else "error", "t": time.time(),
                 "exception": None if value is None else
                 f"{type(value).__name__}: {value}".splitlines()[0]}
        (self.out / "block.json").write_text(json.dumps(block, indent=1))
        watched.stop(remove=True)
        disarm_faulthandler()
        if self.faulthandler_was_enabled:
            faulthandler.enable()
        os.close(self.write_fd)  # end of file: the helper writes its last report and exits
        try:
            self.helper.wait(timeout=HELPER_EXIT_S)
        except subprocess.TimeoutExpired:
            pass  # it finishes on its own; the block's exception must not wait for it
        release_run_dir(self.out)
        self.watched = None
        return False  # the block's exception, if any, propagates


def _helper(argv: list[str]) -> int:
    """The helper's main: PID RUN_DIR STALL_TIMEOUT_S DEADLINE_S NO_REDACT."""
    try:
        pid, run_dir = int(argv[0]), Path(argv[1])
        stall_timeout_s, deadline_s, no_redact = float(argv[2]), float(argv[3]), argv[4] == "1"
    except (IndexError, ValueError):
        print("nsadiag.commands.watch: usage: python -m nsadiag.commands.watch PID RUN_DIR "
              "STALL_TIMEOUT_S DEADLINE_S NO_REDACT", file=sys.stderr)
        return 2
    watch_block(pid, run_dir, stall_timeout_s, deadline_s,
            lambda record: _write_report(record, run_dir, no_redact))
    return 0


def _write_report(record: TrialRecord, run_dir: Path, no_redact: bool) -> None:
    """The block's finding, decided once; record.json with it, and report.md and
    summary.json rendered from that record (as for nsadiag run)."""
    record = with_finding(record)
    write_json(run_dir / "record.json", record.to_dict())
    render_record(record, run_dir, no_redact)


if __name__ == "__main__":
    sys.exit(_helper(sys.argv[1:]))
