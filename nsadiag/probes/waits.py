"""What the operating system says a stalled process waits on: read from /proc, never from
inside the process.

``read_waits(pid)`` returns a ``ProcessWaits``: each thread's kernel wait channel
(/proc/PID/task/TID/wchan, e.g. ``pipe_read``, ``do_wait``, ``futex_wait_queue``) and the
system call it sits in with its first argument (/proc/PID/task/TID/syscall: for ``read``
the file descriptor, for ``wait4`` the pid waited for); its open descriptors with what they
point at (a pipe's inode, a file's path and inode) and their access mode; its children,
each read the same way; the ``flock``/``fcntl`` locks (/proc/locks) on the files it has
open, with the pid that holds each one and whether it is only waited for; each socket a
thread reads, with its addresses (/proc/PID/net/tcp, tcp6, udp, unix) and, for a TCP
connection whose other end is on this machine, the process that holds that end (the
socket inode in its /proc/PID/fd); and the ``Scope`` of
each frame of the user's own code (the ``with`` blocks around its line: the locks it
holds; the loop it is in), from nsadiag.probes.scopes. Whatever cannot
be read (a process gone, a /proc that hides it) is left out and named in ``unreadable``.

The facts are typed and frozen (nsadiag.waitfacts, below every package that reads them).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

from nsadiag.waitfacts import (
    READ_SYSCALLS,
    STOP_WCHAN,
    TERMINAL,
    TRACE_WCHAN,
    EndedProcess,
    FileLock,
    OpenFile,
    PipeWriter,
    ProcessWaits,
    Scope,
    SocketEnd,
    Stopped,
    ThreadWait,
    syscall_name,
)

CHILD_DEPTH = 2
"""How many generations of children are read (a shell between a process and its tool)."""
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
              11: "CLOSING"}
"""The kernel's TCP states by number, as /proc/net/tcp prints them (include/net/tcp_states.h)."""
PROCESS_SCAN_LIMIT = 4096
"""Processes looked through, at most, for the one that holds a socket's other end."""


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


def _thread_reads_terminal(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of ``pid`` is blocked reading a terminal and nothing else (see
    ``reads_terminal``)."""
    text = _read(f"/proc/{pid}/task/{tid}/syscall")
    parts = (text or "").split()
    if len(parts) < 3 or not parts[0].isdigit():
        return False
    name = syscall_name(int(parts[0]))
    args = [int(part, 16) for part in parts[1:7] if part.startswith("0x")]
    fds = _waited_fds(pid, name, args)
    if not fds:
        return False
    for fd in fds:
        try:
            if not TERMINAL.match(os.readlink(f"/proc/{pid}/fd/{fd}")):
                return False
        except OSError:
            return False
    return True


def reads_terminal(pid: int) -> bool:
    """Whether the main thread of ``pid`` is blocked reading a terminal and nothing else: a
    prompt waiting for a person's answer, which is not a stall (nsadiag.harness.streams
    holds the stall clock). ``input()`` on a terminal reads it through readline, which
    waits in select/poll on the descriptor before it reads: those are read too (the
    descriptor sets from the process's memory). False wherever /proc cannot be read."""
    return _thread_reads_terminal(pid, pid)


def terminal_readers(pid: int) -> list[int]:
    """The threads of ``pid`` (their ids, the main thread first) blocked reading a terminal
    as ``reads_terminal`` reads it; [] wherever /proc cannot be read."""
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []
    ordered = [pid, *(tid for tid in tids if tid != pid)] if pid in tids else tids
    return [tid for tid in ordered if _thread_reads_terminal(pid, tid)]


JOIN_FUNCTIONS = ("join", "_wait_for_tstate_lock")
"""threading.py's functions a thread waits in while it joins another."""
JOIN_DUMP_TIMEOUT_S = 5.0
JOIN_RECHECK_S = 10.0
"""How long a read that found the main thread joining stands: the thread it joins may end
and the main thread go on to wait elsewhere while the same threads still read."""
NOT_JOINING_RECHECK_S = 1.0
"""How long a read that found it elsewhere stands: it may be on its way to the join (a
thread that asks at once, while the main thread still sets up)."""


def main_thread_joins(pid: int) -> bool:
    """Whether the main thread of ``pid`` waits in ``Thread.join`` (one nonblocking py-spy
    dump of its Python stack); False when no stack could be read."""
    from nsadiag.probes.stacks import capture  # py-spy: only when a thread prompts

    sample = capture(pid, timeout_s=JOIN_DUMP_TIMEOUT_S)
    if isinstance(sample, str):
        return False
    main = next((t for t in sample.threads if t.name == "MainThread"), None)
    return main is not None and any(
        frame.file.endswith("/threading.py") and
        frame.function.rsplit(".", 1)[-1] in JOIN_FUNCTIONS for frame in main.python_frames())



class PersonWait:
    """Whether a process waits for a person's answer at the terminal: its main thread
    reads it (``reads_terminal``), or another thread does while the main thread joins
    (``input()`` in a worker thread the main thread waits for). A thread that reads the
    terminal while the main thread waits elsewhere (a key listener beside a deadlock) is
    not one: the wait it holds up is not the prompt's. The main thread's stack is read
    again when the reading threads change, or JOIN_RECHECK_S after it was last found
    joining (NOT_JOINING_RECHECK_S after it was found elsewhere).

    One instance serves a whole run: the stall clock (the watch's thread) and the live
    status line (the echo's thread) ask the same one, so that they read one answer from
    one stack read, never two py-spy dumps that may disagree; hence the lock."""

    def __init__(self, joins: Callable[[int], bool] = main_thread_joins,
                 clock: Callable[[], float] = time.monotonic,
                 readers: Callable[[int], list[int]] = terminal_readers):
        self.joins, self.clock, self.readers = joins, clock, readers
        self.known: dict[int, tuple[tuple[int, ...], float, bool]] = {}
        self._lock = threading.Lock()

    def __call__(self, pid: int) -> bool:
        readers = tuple(self.readers(pid))
        if not readers:
            return False
        if readers[0] == pid:
            return True
        with self._lock:
            now = self.clock()
            seen = self.known.get(pid)
            if seen is None or seen[0] != readers or \
                    now - seen[1] >= (JOIN_RECHECK_S if seen[2] else NOT_JOINING_RECHECK_S):
                seen = (readers, now, self.joins(pid))
                self.known[pid] = seen
            return seen[2]


POLLIN = 0x1
MAX_WAITED_FDS = 64
"""More descriptors waited on than this is an event loop, not a prompt."""


def _waited_fds(pid: int, name: str | None, args: list[int]) -> list[int]:
    """The descriptors a thread blocked in system call ``name`` with ``args`` waits to
    read; [] when it is not such a wait or its arguments cannot be read."""
    if name in READ_SYSCALLS and args:
        return [args[0]]
    if name in ("select", "pselect6") and len(args) >= 2 and 0 < args[0] <= MAX_WAITED_FDS \
            and args[1]:
        mask = _memory(pid, args[1], (args[0] + 7) // 8)
        return [fd for fd in range(args[0]) if mask and mask[fd // 8] >> (fd % 8) & 1]
    if name in ("poll", "ppoll") and len(args) >= 2 and 0 < args[1] <= MAX_WAITED_FDS:
        table = _memory(pid, args[0], 8 * args[1])
        if table is None:
            return []
        entries = [struct.unpack_from("ihh", table, 8 * i) for i in range(args[1])]
        return [fd for fd, events, _ in entries if fd >= 0 and events & POLLIN]
    return []


def _memory(pid: int, address: int, size: int) -> bytes | None:
    """``size`` bytes of process ``pid``'s memory at ``address``; None when unreadable."""
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
            memory.seek(address)
            data = memory.read(size)
    except (OSError, OverflowError, ValueError):
        return None
    return data if len(data) == size else None


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


def _address(text: str) -> str:
    """"0100007F:1F90" (IPv4) or 32 hex digits + port (IPv6), as /proc/net/tcp prints them
    (each 32-bit word in the machine's byte order), in the usual form: "127.0.0.1:8080"."""
    host, _, port = text.partition(":")
    raw = b"".join(struct.pack("=I", int(host[i:i + 8], 16)) for i in range(0, len(host), 8))
    family = socket.AF_INET6 if len(raw) == 16 else socket.AF_INET
    shown = socket.inet_ntop(family, raw)
    return f"[{shown}]:{int(port, 16)}" if family == socket.AF_INET6 else \
        f"{shown}:{int(port, 16)}"


def parse_net_inet(text: str) -> dict[int, tuple[str, str, str]]:
    """inode -> (local address, remote address, state) of the lines of /proc/net/tcp,
    tcp6 or udp."""
    found = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10 or not parts[9].isdigit():
            continue
        try:
            found[int(parts[9])] = (_address(parts[1]), _address(parts[2]),
                                    TCP_STATES.get(int(parts[3], 16), parts[3]))
        except (ValueError, OSError, struct.error):
            continue
    return found


def parse_net_unix(text: str) -> dict[int, str]:
    """inode -> path ("" when unnamed) of the lines of /proc/net/unix."""
    found = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 7 and parts[6].isdigit():
            found[int(parts[6])] = parts[7] if len(parts) > 7 else ""
    return found


def _holders(target: str, skip: Collection[int] = ()) -> Iterator[tuple[int, int]]:
    """(pid, fd) of every open file descriptor of this machine's processes (this PID
    namespace, the first PROCESS_SCAN_LIMIT of them, but ``skip``) that links to ``target``
    ("socket:[N]", "pipe:[N]"), as /proc shows them; processes that cannot be read are
    passed over."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return
    for pid in pids[:PROCESS_SCAN_LIMIT]:
        if pid in skip:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    yield pid, int(fd)
            except OSError:
                continue


def _socket_owner(inode: int) -> int | None:
    """The pid of a process of this machine (this PID namespace) with ``socket:[inode]``
    open, None when none is found."""
    return next((pid for pid, _ in _holders(f"socket:[{inode}]")), None)


def _pipe_writers(inode: int, skip: set[int]) -> list[PipeWriter]:
    """The processes of this machine (but ``skip``) with the write end of pipe ``inode``
    open."""
    found = []
    for pid, fd in _holders(f"pipe:[{inode}]", skip):
        held = _open_file(pid, fd)
        if held is not None and "w" in held.mode:
            found.append(PipeWriter(inode, pid, _command_of(pid), fd))
    return found


def _tree(waits: ProcessWaits) -> list[ProcessWaits]:
    return [waits, *(w for child in waits.children for w in _tree(child))]


def _held_pipes(pid: int, threads: tuple[ThreadWait, ...], files: tuple[OpenFile, ...],
                children: tuple[ProcessWaits, ...]) -> tuple[PipeWriter, ...]:
    """Who holds the write end of each pipe a thread reads, where no child read holds it
    (a process the child started, which outlived it, keeps the child's output open)."""
    read = {t.first_arg for t in threads if t.syscall_name in READ_SYSCALLS}
    pipes = {f.inode for f in files if f.fd in read and f.is_pipe and "r" in f.mode and
             f.inode is not None}
    held = {f.inode for c in children for w in _tree(c) for f in w.files if "w" in f.mode}
    return tuple(writer for inode in sorted(pipes - held)
                 for writer in _pipe_writers(inode, {pid}))


EXIT_CODE_FIELD = 49
"""/proc/PID/stat's exit_code (field 52: the status waitpid would report), counted after
the command's closing parenthesis."""


def _zombie(child: Any) -> EndedProcess | None:
    """A child (a psutil.Process) that has ended and waits to be reaped, with the status its
    parent will read; None for a live child."""
    import psutil

    try:
        if child.status() != psutil.STATUS_ZOMBIE:
            return None
        name = child.name()
    except psutil.Error:
        return None
    fields = (_read(f"/proc/{child.pid}/stat") or ")").rsplit(")", 1)[1].split()
    if len(fields) <= EXIT_CODE_FIELD or not fields[EXIT_CODE_FIELD].isdigit():
        return EndedProcess(child.pid, name)
    status = int(fields[EXIT_CODE_FIELD])
    code = -(status & 0x7F) if status & 0x7F else status >> 8 & 0xFF
    return EndedProcess(child.pid, name, code)


def _command_of(pid: int) -> tuple[str, ...]:
    raw = _read(f"/proc/{pid}/cmdline") or ""
    return tuple(part for part in raw.split("\0") if part)


def _socket_end(pid: int, fd: int, inode: int) -> SocketEnd:
    """The socket ``inode`` open at ``fd`` in ``pid``: its protocol and addresses, and the
    process holding the other end of a TCP connection on this machine."""
    for protocol in ("tcp", "tcp6", "udp"):
        table = parse_net_inet(_read(f"/proc/{pid}/net/{protocol}") or "")
        if inode not in table:
            continue
        local, remote, state = table[inode]
        end = SocketEnd(fd, inode, protocol, local, remote, state)
        if not protocol.startswith("tcp") or not end.on_this_machine:
            return end
        other = next((i for i, (near, far, _) in table.items()
                      if near == remote and far == local), None)
        owner = _socket_owner(other) if other is not None else None
        if owner is None:
            return end
        wait = _thread_wait(owner, owner)
        try:
            reads_it = wait is not None and wait.syscall_name in READ_SYSCALLS and \
                os.readlink(f"/proc/{owner}/fd/{wait.first_arg}") == f"socket:[{other}]"
        except OSError:
            reads_it = False
        return SocketEnd(fd, inode, protocol, local, remote, state, owner,
                         _command_of(owner), wait, reads_it)
    path = parse_net_unix(_read(f"/proc/{pid}/net/unix") or "").get(inode)
    return SocketEnd(fd, inode, "unix" if path is not None else "unknown", path or "")


def _read_sockets(pid: int, threads: tuple[ThreadWait, ...], files: tuple[OpenFile, ...]
                  ) -> tuple[SocketEnd, ...]:
    """The sockets some thread of ``pid`` sits reading."""
    reading = {t.first_arg for t in threads if t.syscall_name in READ_SYSCALLS}
    return tuple(_socket_end(pid, f.fd, int(f.target[8:-1])) for f in files
                 if f.fd in reading and f.target.startswith("socket:[") and
                 f.target[8:-1].isdigit())


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
    zombies = {child.pid: _zombie(child) for child in children}
    ended = tuple(z for z in zombies.values() if z is not None)
    read = tuple(read_waits(child.pid, depth - 1) for child in children
                 if zombies[child.pid] is None)
    return ProcessWaits(pid, command, threads, files, read, locks, tuple(unreadable), scopes,
                        _read_sockets(pid, threads, files), ended,
                        _held_pipes(pid, threads, files, read), _stopped(pid, threads))


def _stopped(pid: int, threads: tuple[ThreadWait, ...]) -> Stopped | None:
    """Whether ``pid`` is stopped (state T or t in /proc/PID/stat, or every thread parked
    where the kernel stops them) and, held by a tracer, which one."""
    stat = _read(f"/proc/{pid}/stat") or ""
    state = stat.rsplit(")", 1)[-1].split()[:1]
    letter = state[0] if state else ""
    parked = bool(threads) and all(t.wchan in (STOP_WCHAN, TRACE_WCHAN) for t in threads)
    if letter not in ("T", "t") and not parked:
        return None
    status = _read(f"/proc/{pid}/status") or ""
    tracer = next((int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("TracerPid:") and len(line.split()) > 1), 0)
    if tracer:
        return Stopped(letter or "t", tracer, _command_of(tracer))
    return Stopped(letter or "T")
