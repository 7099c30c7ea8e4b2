"""What the operating system says a stalled process waits on: read from /proc, never from
inside the process.

``read_waits(pid)`` returns a ``ProcessWaits``: each thread's kernel wait channel
(/proc/PID/task/TID/wchan, e.g. ``pipe_read``, ``do_wait``, ``futex_wait_queue``) and the
system call it sits in with its first argument (/proc/PID/task/TID/syscall: for ``read``
the file descriptor, for ``wait4`` the pid waited for); its open descriptors with what they
point at (a pipe's inode, a file's path and inode) and their access mode; its children,
each read the same way; the ``flock``/``fcntl`` locks (/proc/locks) on the files it has
open, with the pid that holds each one and whether it is only waited for; and the ``Scope`` of
each frame of the user's own code (the ``with`` blocks around its line: the locks it
holds; the loop it is in), from nsadiag.probes.scopes. Whatever cannot
be read (a process gone, a /proc that hides it) is left out and named in ``unreadable``.

The facts are typed and frozen (nsadiag.waitfacts, below every package that reads them).
"""

from __future__ import annotations

import os

from nsadiag.waitfacts import (
    FileLock,
    OpenFile,
    ProcessWaits,
    Scope,
    ThreadWait,
    syscall_name,
)

CHILD_DEPTH = 2
"""How many generations of children are read (a shell between a process and its tool)."""



def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def parse_syscall(text: str) -> tuple[int | None, int | None]:
    """(number, first argument) of a /proc/.../syscall line; (None, None) for "running"
    or an unreadable line."""
    parts = text.split()
    if not parts or not parts[0].lstrip("-").isdigit() or int(parts[0]) < 0:
        return None, None
    first = int(parts[1], 16) if len(parts) > 1 and parts[1].startswith("0x") else None
    return int(parts[0]), first


def _thread_wait(pid: int, tid: int) -> ThreadWait | None:
    base = f"/proc/{pid}/task/{tid}"
    wchan = _read(f"{base}/wchan")
    syscall = _read(f"{base}/syscall")
    if wchan is None and syscall is None:
        return None
    number, first = parse_syscall(syscall or "")
    return ThreadWait(tid, wchan.strip() if wchan and wchan.strip() not in ("", "0") else None,
                      number, syscall_name(number) if number is not None else None, first)


MODES = {0: "r", 1: "w", 2: "rw"}


def _open_file(pid: int, fd: int) -> OpenFile | None:
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None
    info = _read(f"/proc/{pid}/fdinfo/{fd}") or ""
    flags = next((line.split()[1] for line in info.splitlines() if line.startswith("flags:")),
                 None)
    mode = MODES.get(int(flags, 8) & 3, "?") if flags else "?"
    inode = next((int(line.split()[1]) for line in info.splitlines()
                  if line.startswith("ino:")), None)
    if target.startswith("pipe:["):
        inode = int(target[6:-1])
    elif inode is None and target.startswith("/"):
        try:  # kernels before 5.x print no "ino:" in fdinfo
            inode = os.stat(target).st_ino
        except OSError:
            inode = None
    return OpenFile(fd, target, mode, inode)


def parse_locks(text: str) -> list[tuple[str, str, int, int, bool]]:
    """(kind, access, pid, inode, blocked) of each line of /proc/locks ("1: FLOCK
    ADVISORY WRITE 4242 08:01:1234 0 EOF"; a waiter's line reads "1: -> FLOCK ...")."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        blocked = len(parts) > 1 and parts[1] == "->"
        if blocked:
            parts = parts[:1] + parts[2:]
        if len(parts) < 6 or not parts[4].isdigit() or parts[5].count(":") != 2:
            continue
        found.append((parts[1], parts[3], int(parts[4]), int(parts[5].split(":")[2]), blocked))
    return found


def read_waits(pid: int, depth: int = CHILD_DEPTH, scopes: tuple[Scope, ...] = ()
               ) -> ProcessWaits:
    """The ProcessWaits of ``pid`` and of its children ``depth`` generations down, with the
    ``scopes`` of its last stack sample (nsadiag.probes.scopes.thread_scopes)."""
    # imported here: this module's types reach every watched process through
    # nsadiag.evidence, whose interpreter may have no psutil (another environment's python)
    import psutil

    unreadable: list[str] = []
    try:
        process = psutil.Process(pid)
        command = tuple(process.cmdline())
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        children = process.children() if depth > 0 else []
    except (psutil.Error, OSError) as error:
        return ProcessWaits(pid, (), unreadable=(f"process {pid}: {error}",))
    threads = tuple(w for w in (_thread_wait(pid, tid) for tid in tids) if w is not None)
    try:
        fds = sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError as error:
        fds = []
        unreadable.append(f"open files of {pid}: {error.strerror or error}")
    files = tuple(f for f in (_open_file(pid, fd) for fd in fds) if f is not None)
    paths = {f.inode: f.target for f in files if f.inode is not None and not f.is_pipe}
    locks = tuple(FileLock(kind, access, holder, inode, blocked, paths[inode])
                  for kind, access, holder, inode, blocked in parse_locks(
                      _read("/proc/locks") or "") if inode in paths)
    return ProcessWaits(pid, command, threads, files,
                        tuple(read_waits(child.pid, depth - 1) for child in children),
                        locks, tuple(unreadable), scopes)
