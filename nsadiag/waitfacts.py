"""The typed facts of what a stalled process waits on, as the operating system tells them:
each thread's wait channel and system call, open files, file locks, the ``with`` blocks and
loop around each frame of the user's own code, the same for its children, and the children
that ended before the stall (nsadiag.harness.child_exits). They are
read by nsadiag.probes.waits and carried in the record by nsadiag.evidence; standard
library only, so the evidence of every watched process can hold them.

The facts are frozen; ``to_dict``/``from_dict`` are their JSON form for the record on disk.
"""

from __future__ import annotations

import platform
import re
import signal
from dataclasses import dataclass, field
from typing import Any

SYSCALLS_X86_64 = {0: "read", 1: "write", 7: "poll", 17: "pread64", 23: "select",
                   35: "nanosleep", 45: "recvfrom", 47: "recvmsg", 61: "wait4", 72: "fcntl",
                   73: "flock",
                   202: "futex", 230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid",
                   270: "pselect6", 271: "ppoll", 281: "epoll_pwait", 288: "accept4",
                   43: "accept", 19: "readv", 295: "preadv"}
"""x86_64 system call numbers of the waits the chain reads (arch/x86/entry/syscalls/
syscall_64.tbl); other machines get the number only, and the wait channel."""
READ_SYSCALLS = ("read", "readv", "pread64", "recvfrom", "recvmsg", "preadv")
"""The system calls of a blocking read."""
TERMINAL = re.compile(r"^/dev/(pts/\d+|tty\w*|console)$")
"""What a descriptor open on a terminal points at."""


def syscall_name(number: int) -> str | None:
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


STOP_WCHAN = "do_signal_stop"
"""Where the kernel parks a thread of a process stopped by SIGSTOP, SIGTSTP, SIGTTIN or
SIGTTOU (state T in /proc/PID/stat) until it gets SIGCONT."""
TRACE_WCHAN = "ptrace_stop"
"""Where it parks a thread a tracer (a debugger, strace) holds stopped (state t)."""


@dataclass(frozen=True)
class Stopped:
    """A process that does not run because it is stopped, not because it waits: by a
    signal (``tracer_pid`` None: only SIGCONT resumes it), or held by a tracer (its pid and
    command, from /proc/PID/status's TracerPid)."""

    state: str
    tracer_pid: int | None = None
    tracer_command: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "tracer_pid": self.tracer_pid,
                "tracer_command": list(self.tracer_command)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stopped:
        return cls(str(data["state"]), data.get("tracer_pid"),
                   tuple(str(a) for a in data.get("tracer_command") or ()))


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
class SocketEnd:
    """One socket a thread of the process reads: its descriptor and inode, ``protocol``
    ("tcp", "tcp6", "udp", "unix"), the local and remote addresses as /proc/net shows them
    ("127.0.0.1:5000"; a Unix socket's path, "" when unnamed), the TCP state
    ("ESTABLISHED"); and, when a process of this machine holds the other end, its pid,
    command and where its first thread waits in the kernel."""

    fd: int
    inode: int
    protocol: str
    local: str = ""
    remote: str = ""
    state: str = ""
    peer_pid: int | None = None
    peer_command: tuple[str, ...] = ()
    peer_wait: ThreadWait | None = None
    peer_reads_it: bool = False  # the peer's first thread sits reading this connection

    @property
    def on_this_machine(self) -> bool:
        """Whether the remote address is a loopback one (the peer, if any, runs here)."""
        host = self.remote.rpartition(":")[0].strip("[]")
        return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or \
            host.startswith("::ffff:127.")

    def to_dict(self) -> dict[str, Any]:
        return {"fd": self.fd, "inode": self.inode, "protocol": self.protocol,
                "local": self.local, "remote": self.remote, "state": self.state,
                "peer_pid": self.peer_pid, "peer_command": list(self.peer_command),
                "peer_wait": self.peer_wait.to_dict() if self.peer_wait else None,
                "peer_reads_it": self.peer_reads_it}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SocketEnd:
        wait = data.get("peer_wait")
        return cls(int(data["fd"]), int(data["inode"]), str(data["protocol"]),
                   str(data.get("local") or ""), str(data.get("remote") or ""),
                   str(data.get("state") or ""), data.get("peer_pid"),
                   tuple(data.get("peer_command") or ()),
                   ThreadWait.from_dict(wait) if wait else None,
                   bool(data.get("peer_reads_it")))


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
class EndedProcess:
    """A child process that ended before the stall: its pid, ``name`` (multiprocessing's
    name of it, "ForkPoolWorker-2"; "" when none), and ``returncode`` as its parent read it
    (negative: the signal that killed it); None when no watched parent read it, so its exit
    status is not known."""

    pid: int
    name: str = ""
    returncode: int | None = None

    def status(self) -> str:
        """"killed by SIGKILL", "exited with code 3", or that the status is not known."""
        if self.returncode is None:
            return "its exit status is not known: no watched process reaped it"
        if self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exited with code {self.returncode}"

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "returncode": self.returncode}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndedProcess:
        code = data.get("returncode")
        return cls(int(data["pid"]), str(data.get("name") or ""),
                   int(code) if code is not None else None)


@dataclass(frozen=True)
class PipeWriter:
    """A process of this machine that holds the write end (descriptor ``fd``) of a pipe
    (``inode``) a thread of the process reads, found when no child of the process holds
    it: the write end that keeps the read from reaching end of file."""

    inode: int
    pid: int
    command: tuple[str, ...]
    fd: int

    def to_dict(self) -> dict[str, Any]:
        return {"inode": self.inode, "pid": self.pid, "command": list(self.command),
                "fd": self.fd}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PipeWriter:
        return cls(int(data["inode"]), int(data["pid"]), tuple(data.get("command") or ()),
                   int(data["fd"]))


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
    sockets: tuple[SocketEnd, ...] = ()
    ended: tuple[EndedProcess, ...] = ()  # its children that ended before the stall
    pipe_writers: tuple[PipeWriter, ...] = ()
    stopped: Stopped | None = None  # stopped by a signal or a tracer, not waiting

    def thread(self, tid: int | None) -> ThreadWait | None:
        return next((t for t in self.threads if t.tid == tid), None)

    def file(self, fd: int | None) -> OpenFile | None:
        return next((f for f in self.files if f.fd == fd), None)

    def socket(self, fd: int | None) -> SocketEnd | None:
        return next((s for s in self.sockets if s.fd == fd), None)

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": list(self.command),
                "threads": [t.to_dict() for t in self.threads],
                "files": [f.to_dict() for f in self.files],
                "children": [c.to_dict() for c in self.children],
                "locks": [lock.to_dict() for lock in self.locks],
                "unreadable": list(self.unreadable),
                "scopes": [scope.to_dict() for scope in self.scopes],
                "sockets": [end.to_dict() for end in self.sockets],
                "ended": [child.to_dict() for child in self.ended],
                "pipe_writers": [writer.to_dict() for writer in self.pipe_writers],
                **({"stopped": self.stopped.to_dict()} if self.stopped else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessWaits:
        return cls(int(data["pid"]), tuple(data.get("command") or ()),
                   tuple(ThreadWait.from_dict(t) for t in data.get("threads") or ()),
                   tuple(OpenFile.from_dict(f) for f in data.get("files") or ()),
                   tuple(ProcessWaits.from_dict(c) for c in data.get("children") or ()),
                   tuple(FileLock.from_dict(lock) for lock in data.get("locks") or ()),
                   tuple(data.get("unreadable") or ()),
                   tuple(Scope.from_dict(scope) for scope in data.get("scopes") or ()),
                   tuple(SocketEnd.from_dict(end) for end in data.get("sockets") or ()),
                   tuple(EndedProcess.from_dict(child) for child in data.get("ended") or ()),
                   tuple(PipeWriter.from_dict(w) for w in data.get("pipe_writers") or ()),
                   Stopped.from_dict(data["stopped"]) if data.get("stopped") else None)
