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

The facts are typed and frozen; ``to_dict``/``from_dict`` are their JSON form for the
record on disk.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from typing import Any

SYSCALLS_X86_64 = {0: "read", 1: "write", 7: "poll", 17: "pread64", 23: "select",
                   35: "nanosleep", 45: "recvfrom", 61: "wait4", 72: "fcntl", 73: "flock",
                   202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid",
                   270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
                   43: "accept", 19: "readv", 295: "preadv"}
"""x86_64 system call numbers of the waits the chain reads (arch/x86/entry/syscalls/
syscall_64.tbl); other machines get the number only, and the wait channel."""
CHILD_DEPTH = 2
"""How many generations of children are read (a shell between a process and its tool)."""


def _syscall_name(number: int) -> str | None:
    return SYSCALLS_X86_64.get(number) if platform.machine() == "x86_64" else None


@dataclass(frozen=True)
class ThreadWait:
    """Where one thread sits in the kernel: ``wchan`` ("pipe_read"; None when running or
    unreadable), the system call's number and name, and its first argument (a descriptor
    for read/write/flock, a pid for wait4)."""

    tid: int
    wchan: str | None
    syscall: int | None = None
    syscall_name: str | None = None
    first_arg: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tid": self.tid, "wchan": self.wchan, "syscall": self.syscall,
                "syscall_name": self.syscall_name, "first_arg": self.first_arg}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThreadWait:
        return cls(int(data["tid"]), data.get("wchan"), data.get("syscall"),
                   data.get("syscall_name"), data.get("first_arg"))


@dataclass(frozen=True)
class OpenFile:
    """One open descriptor: what it points at ("pipe:[81234]", a path, "socket:[...]"), the
    inode of a pipe or file, and its access mode ("r", "w" or "rw")."""

    fd: int
    target: str
    mode: str
    inode: int | None = None

    @property
    def is_pipe(self) -> bool:
        return self.target.startswith("pipe:")

    def to_dict(self) -> dict[str, Any]:
        return {"fd": self.fd, "target": self.target, "mode": self.mode, "inode": self.inode}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OpenFile:
        return cls(int(data["fd"]), str(data["target"]), str(data["mode"]), data.get("inode"))


@dataclass(frozen=True)
class FileLock:
    """One line of /proc/locks on a file the process has open: FLOCK or POSIX, READ or
    WRITE, the pid that holds it (or waits for it, ``blocked``), and the file's inode."""

    kind: str
    access: str
    pid: int
    inode: int
    blocked: bool
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "access": self.access, "pid": self.pid, "inode": self.inode,
                "blocked": self.blocked, "path": self.path}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileLock:
        return cls(str(data["kind"]), str(data["access"]), int(data["pid"]),
                   int(data["inode"]), bool(data["blocked"]), data.get("path"))


@dataclass(frozen=True)
class Scope:
    """One frame's enclosing blocks: ``withs`` ((item text, line), outermost first) and
    ``loop`` (header text, line) of the innermost loop around ``line``, or None."""

    thread_id: int
    file: str
    function: str
    line: int
    withs: tuple[tuple[str, int], ...] = ()
    loop: tuple[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "file": self.file, "function": self.function,
                "line": self.line, "withs": [list(w) for w in self.withs],
                "loop": list(self.loop) if self.loop else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scope:
        loop = data.get("loop")
        return cls(int(data["thread_id"]), str(data["file"]), str(data["function"]),
                   int(data["line"]), tuple((str(t), int(n)) for t, n in data.get("withs") or ()),
                   (str(loop[0]), int(loop[1])) if loop else None)


@dataclass(frozen=True)
class ProcessWaits:
    """What the OS says of one process (see the module docstring)."""

    pid: int
    command: tuple[str, ...]
    threads: tuple[ThreadWait, ...] = ()
    files: tuple[OpenFile, ...] = ()
    children: tuple[ProcessWaits, ...] = ()
    locks: tuple[FileLock, ...] = ()
    unreadable: tuple[str, ...] = field(default=())
    scopes: tuple[Scope, ...] = ()

    def thread(self, tid: int | None) -> ThreadWait | None:
        return next((t for t in self.threads if t.tid == tid), None)

    def file(self, fd: int | None) -> OpenFile | None:
        return next((f for f in self.files if f.fd == fd), None)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": list(self.command),
                "threads": [t.to_dict() for t in self.threads],
                "files": [f.to_dict() for f in self.files],
                "children": [c.to_dict() for c in self.children],
                "locks": [lock.to_dict() for lock in self.locks],
                "unreadable": list(self.unreadable),
                "scopes": [scope.to_dict() for scope in self.scopes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessWaits:
        return cls(int(data["pid"]), tuple(data.get("command") or ()),
                   tuple(ThreadWait.from_dict(t) for t in data.get("threads") or ()),
                   tuple(OpenFile.from_dict(f) for f in data.get("files") or ()),
                   tuple(ProcessWaits.from_dict(c) for c in data.get("children") or ()),
                   tuple(FileLock.from_dict(lock) for lock in data.get("locks") or ()),
                   tuple(data.get("unreadable") or ()),
                   tuple(Scope.from_dict(scope) for scope in data.get("scopes") or ()))


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
                      number, _syscall_name(number) if number is not None else None, first)


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
