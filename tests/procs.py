"""Process helpers for the tests that assert nothing outlives nsadiag."""

from __future__ import annotations

import time
from collections.abc import Callable
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


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str,
             every_s: float = 0.1) -> Any:
    """Poll ``condition`` until it returns something true, and return that; an
    AssertionError naming ``what`` after ``timeout_s`` (a deadline, never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")
