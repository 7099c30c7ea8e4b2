"""Process-tree helpers shared by the DDP runner, the ddp check, `nsadiag stacks --ranks`
and `nsadiag attach --ranks`: the ranks under a launcher, and whether a live process can be
sampled at all."""

from __future__ import annotations

import ctypes
import re
import signal
from pathlib import Path

import psutil

from nsadiag.probes import stacks

PR_SET_PDEATHSIG = 1
PYTHON_NAME = re.compile(r"^(python|pypy)[\d.]*[dmu]?$")
"""The names of a Python interpreter's executable: python, python3, python3.11, pypy3."""


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


def can_attach(pid: int, permission: str) -> None:
    """ValueError (one line) when the process is missing, or when ptrace will be refused
    (``permission``: nsadiag.envinfo.ptrace_permission()) and the faulthandler fallback is
    not possible either (see nsadiag.probes.stacks)."""
    if not psutil.pid_exists(pid):
        raise ValueError(f"pid: no process {pid}")
    if permission.startswith("refused"):
        reason = permission
    elif permission.startswith("children only") and pid not in _own_descendants():
        reason = f"process {pid} is not a child of this shell and {permission}"
    else:
        return
    fallback = stacks.faulthandler_target(pid)
    if isinstance(fallback, str):  # py-spy cannot attach and faulthandler cannot stand in
        raise ValueError(f"ptrace: {reason}; {fallback}")


def _own_descendants() -> set[int]:
    me = psutil.Process()
    return {p.pid for p in me.children(recursive=True)}


def rank_processes(launcher_pid: int) -> list[tuple[int, int | None]]:
    """(pid, rank) of the Python processes under a launcher, ranks from their RANK env
    (helpers of a rank that inherited its RANK are left out); ValueError (one line) when
    the launcher is gone or has no Python process under it."""
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        raise ValueError(f"pid: no process {launcher_pid}") from None
    found = []
    for child in children:
        try:
            if "python" not in " ".join(child.cmdline()).lower():
                continue
            rank = child.environ().get("RANK")
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if is_rank_helper(child, rank):  # a worker of a rank, not a rank
            continue
        found.append((child.pid, int(rank) if rank and rank.isdigit() else None))
    if not found:
        raise ValueError(f"ranks: no Python process under {launcher_pid}")
    return sorted(found, key=lambda item: (item[1] is None, item[1], item[0]))


def check_python(pid: int, hint: str) -> None:
    """ValueError (one line, ending with ``hint``: what the command needs) when ``pid`` is
    known not to run Python: neither its program nor its command's first word is an
    interpreter, and no libpython is mapped into it (a program that embeds Python); or when
    neither its program nor its memory can be read (nothing could sample it). Each is read
    where it can be; a process whose memory map alone cannot be read passes: py-spy says
    what it finds."""
    try:
        process = psutil.Process(pid)
        name = process.name()
    except psutil.Error:
        return
    names, refused = [], 0
    for read in (lambda: [process.exe()], lambda: process.cmdline()[:1]):
        try:
            names += [Path(word).name for word in read() if word]
        except psutil.AccessDenied:
            refused += 1
        except (psutil.Error, OSError):
            continue
    if any(PYTHON_NAME.match(word) for word in names):
        return
    try:
        mapped = Path(f"/proc/{pid}/maps").read_text()
    except PermissionError:
        if refused:  # neither its program nor its memory can be read: nothing can sample it
            raise ValueError(f"pid: process {pid} ({name}) cannot be read (its executable "
                             f"and its memory map are refused to this user); {hint}") \
                from None
        return
    except OSError:
        return
    if "libpython" in mapped:
        return
    kind = "a kernel thread" if not mapped and not names else f"{name}"
    raise ValueError(f"pid: process {pid} ({kind}) is not a Python process; {hint}")


def is_python(pid: int) -> bool:
    """Whether ``pid`` may run Python (``check_python`` finds nothing against it)."""
    try:
        check_python(pid, "")
    except ValueError:
        return False
    return True
