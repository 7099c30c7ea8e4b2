"""Process-tree helpers shared by the DDP runner, the ddp check and `nsadiag stacks --ranks`."""

from __future__ import annotations

import ctypes
import signal

import psutil

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere a no-op).

    torchrun starts each rank in its own session, so killing the launcher's process group
    does not reach the ranks; this does."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _rank_env(process: psutil.Process) -> str | None:
    try:
        return process.environ().get("RANK")
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def is_rank_helper(process: psutil.Process, rank: str | None) -> bool:
    """True for a process that inherited its parent's RANK (a DataLoader or compile worker
    of a rank), i.e. not the rank itself."""
    try:
        parent = process.parent()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return rank is not None and parent is not None and _rank_env(parent) == rank


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of the rank processes under a launcher (RANK in their environment);
    children of a rank that inherited its RANK are not ranks. Empty when the launcher is
    gone."""
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return {}
    found: dict[int, int] = {}
    for child in children:
        rank = _rank_env(child)
        if rank is not None and rank.isdigit() and not is_rank_helper(child, rank):
            found.setdefault(int(rank), child.pid)
    return found
