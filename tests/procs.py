"""Process helpers: a test's own processes found (and those that must not outlive
nsadiag), waited on with a deadline, and ended."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from nsadiag.harness.launch import OWNER_ENV


def running(process: psutil.Process) -> bool:
    """True while the process runs (a zombie has ended)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def owned_by(owner_pid: int) -> list[psutil.Process]:
    """Live processes carrying a job token of the nsadiag process `owner_pid`."""
    prefix = f"{OWNER_ENV}={owner_pid}-"
    found = []
    for process in psutil.process_iter():
        try:
            if any(f"{k}={v}".startswith(prefix) for k, v in process.environ().items()):
                found.append(process)
        except psutil.Error:
            continue
    return [p for p in found if running(p)]


def with_environ(name: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has ``name=value`` (a mark one test gave the
    command it started: tests running beside it never carry it)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(name) == value:
                found.append(process)
        except psutil.Error:
            continue
    return [p for p in found if running(p)]


def with_cmdline(text: str) -> list[psutil.Process]:
    """Live processes whose command line contains `text`."""
    found = []
    for process in psutil.process_iter():
        try:
            if text in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return [p for p in found if running(p)]


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str | Callable[[], str],
             every_s: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something true, and return that; an
    AssertionError naming ``what`` after ``timeout_s`` (a deadline, never a fixed sleep).
    A callable ``what`` is asked at the deadline (to say what was seen instead)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def descendants(pid: int, cmdline_has: str = "") -> list[psutil.Process]:
    """The descendants of process ``pid`` whose command line contains ``cmdline_has``
    (all of them by default, zombies included; a zombie's command line is empty); none
    once ``pid`` is gone."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            if cmdline_has in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def _thread_states(pid: int) -> list[str]:
    """The scheduler state letter of each thread of process ``pid`` (R runs or waits for
    a core, S sleeps in a wait, ...), from /proc/PID/task/*/stat."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
    return states


def blocked(pid: int, threads: int = 0) -> Callable[[], bool]:
    """A condition for wait_for: true once the main thread of process ``pid`` sleeps in a
    wait and used no CPU since the condition's previous call (a thread that waits a moment
    for the GIL, a core or a pipe between two pieces of work reads as not blocked). With
    ``threads``, the process must run that many threads, every one of them asleep, and none
    used CPU since the previous call."""
    last: list[float | None] = [None]

    def reading() -> tuple[float, bool] | None:
        """(CPU seconds used so far, asleep now) of the threads that count."""
        try:
            process = psutil.Process(pid)
            if threads:
                states, times = _thread_states(pid), process.cpu_times()
                return times.user + times.system, len(states) == threads and \
                    set(states) == {"S"}
            main = next(t for t in process.threads() if t.id == pid)
            return main.user_time + main.system_time, \
                process.status() == psutil.STATUS_SLEEPING
        except (OSError, psutil.Error, StopIteration):
            return None

    def check() -> bool:
        now = reading()
        previous, last[0] = last[0], None if now is None else now[0]
        return now is not None and now[1] and previous == now[0]
    return check


def kill_tree(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGKILL every descendant of ``proc``, then ``proc`` itself (its whole process group
    when it leads one, as a command started in a session of its own does), and reap it."""
    for child in descendants(proc.pid):
        try:
            child.kill()
        except psutil.Error:
            continue
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    proc.wait(timeout=timeout_s)
