"""The wait chain of a stuck process (pure): what its thread waits on, who could release
it, and what that one is doing, each hop from evidence.

``wait_chain(evidence, verdict)`` follows, from the thread the stall verdict names (the
main thread first), a few hops:

lock        ``with X:`` / ``X.acquire()``: the thread of the same process inside a ``with
            X:`` block (nsadiag.probes.scopes, read at the stall) holds it (the waiting
            thread itself, in an outer frame: a lock taken twice); that thread's
            own wait is the next hop (a cycle when it waits for a lock the first one
            holds). No live thread inside such a block: in a process forked from another
            (a DataLoader worker) the holder was a thread that did not survive the fork;
            otherwise no holder is known.
queue       ``Queue.get``/``Event.wait``/``Condition.wait``: a thread that died of an
            exception (nsadiag.harness.thread_exceptions) is the producer that is gone;
            else the other live threads, none of which is known to feed it.
join        ``Thread.join``: the process's one other live thread of the user's, followed as
            the chain of its own (which of several is the one joined is not known).
pool        a wait for a ``multiprocessing.Pool``'s results: a worker that runs a task,
            followed; every worker idle means no worker holds the awaited task: a
            pool worker that ended before the stall (nsadiag.harness.child_exits, with
            its exit status as the pool read it) took it, and the workers started in
            its place are named.
terminal    a read of a terminal (``input()`` at a prompt): a person's answer, the end.
child       ``Popen.wait``/``subprocess.run`` (or the kernel's ``wait4``), or a read of a
            pipe whose write end a child holds (its output, read to the end): the child
            (pid, command) and where the kernel holds it; a child reading a pipe whose
            write end this process holds is a pipe that never reaches end of file. Inside
            torch.compile the child is the program the compiler runs (its C++ compiler).
pipe        a read of a pipe whose write end no child holds: the processes of the machine
            that hold it (nsadiag.probes.waits scans /proc), and the child that ended
            (its exit status from /proc, as its parent will read it) when the read is a
            subprocess's output.
file lock   ``flock``/``fcntl`` in the kernel: the pid that holds a lock on the same file
            (/proc/locks) and where it stands.
compile     a wait for a job of torch.compile's compile workers (``Future.result`` under
            inductor's async_compile/codecache): inductor's compile-worker process (a
            child running torch/_inductor/compile_worker/__main__.py) and the workers it
            forked, or the compile threads of this process; the worker inside a job is
            followed (its own wait for the C++ compiler ends as compile-cxx), workers all
            idle are said so.
worker      a wait inside the DataLoader: the worker processes sampled at the stall and
            the frame each stands at, followed as a process of its own.
socket      a read on a socket (the kernel's read/recv on a descriptor that is one): the
            connection's addresses, the process of this machine that holds the other
            end (its pid and command, from /proc) and where it stands when it was sampled;
            an end on another machine (or one this machine does not show) is said to be
            out of sight.
poll        a ``while`` loop around a sleep: the condition it polls; a sleep in straight
            code or a ``for`` loop is a sleep, with the time written in the line.

A hop the evidence does not name is stated as unknown, never guessed. The chain's ``end``
(``ENDS``) is what the next step is derived from (nsadiag.finding.trial).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from nsadiag.evidence import Evidence, StackFrame, StackSample, StallEvidence, ThreadStack
from nsadiag.probes.compiler import compiler_frame
from nsadiag.probes.frames import (
    POOL_FILE,
    awaits_inductor_job,
    executor_job,
    is_pool_worker_loop,
    own_code,
    pool_worker_thread,
    user_threads,
    wait_frame,
)
from nsadiag.verdict.names import Verdict
from nsadiag.waitfacts import (
    READ_SYSCALLS,
    TERMINAL,
    EndedProcess,
    OpenFile,
    PipeWriter,
    ProcessWaits,
    Scope,
    SocketEnd,
    ThreadWait,
)

HOPS = ("lock", "holder", "queue", "join", "pool", "producer", "child", "pipe", "file-lock",
        "future",
        "terminal", "sleep", "process",
        "worker", "poll", "socket", "peer", "collective", "frame", "ended", "compile-pool",
        "unknown")
ENDS = ("lock-cycle", "lock-self", "lock-held", "lock-lost", "lock-lost-fork", "queue-full",
        "producer-died", "no-producer", "pipe-eof", "child-waits", "file-lock", "worker",
        "poll", "socket-peer", "socket-remote", "uneven-steps", "collective-differs",
        "compile-cxx", "compile-child", "compile-worker", "pool-lost-task", "pool-worker-ended",
        "pool-worker", "pipe-held", "terminal-input", "sleep", "stopped", "loop-self",
        "pool-starved", "pipe-unread", "unknown")
"""How a chain ends. lock-cycle: two threads each hold the lock the other waits for;
lock-self: the waiting thread holds it itself, in an outer frame;
lock-held: the holder is found and waits or works elsewhere; lock-lost: no live thread
holds it; lock-lost-fork: the same in a forked process (the holder did not survive the
fork); queue-full: the holder waits in Queue.put; producer-died: the thread that fed a
queue died; no-producer: no thread is known to feed it; pipe-eof: a child reads a pipe
whose write end the waiting process holds; pipe-held: a thread reads a pipe whose write
end a process other than its children holds (the child whose output it is may have ended);
child-waits: a child blocked elsewhere;
file-lock: another process holds a file lock; worker: a DataLoader worker stands at its
frame; poll: a loop polls a condition; socket-peer: a read on a connection whose other
end a process of this machine holds; socket-remote: a read on a TCP or UDP connection whose
other end is out of sight (another machine, or a namespace this one does not show);
uneven-steps: ranks that ran fewer steps wait in a collective after their loop while the
others wait in a step's gradient collective;
collective-differs: the ranks issued different collectives at the same number;
compile-cxx: torch.compile waits for the program it runs as its C++ compiler (its C++ build,
torch/_inductor/cpp_builder.py, is on the stack), which does not exit; compile-child: the
same for another program torch.compile started; compile-worker: a compile worker of
torch.compile (inductor's compile-worker process or compile thread) stands at its frame
in the job awaited; pool-lost-task: every worker of a
multiprocessing pool waits idle for a task while the pool's results are awaited (the task
went with a worker that ended); pool-worker-ended: the same, with the worker that ended
(its pid and exit status, or that the status is not known) named; pool-worker: a pool
worker stands at its frame;
terminal-input: a read of the terminal (a prompt waiting for its answer); sleep: a sleep
written in the user's line, outside a polling loop; stopped: the process does not wait at
all, it is stopped (by SIGSTOP, SIGTSTP, SIGTTIN or SIGTTOU, or held by a tracer);
loop-self: a thread that runs the asyncio event loop waits for a future whose coroutine
needs that loop (``run_coroutine_threadsafe(...).result()`` on the loop's own thread);
pool-starved: every worker of a thread pool runs a task that waits for another future,
so the tasks they wait for never get a worker; pipe-unread: a child the process waits for
is blocked writing into a pipe the process holds the read end of and does not read while
it waits (a multiprocessing.Queue joined before it is read); unknown:
the evidence names no next
hop.
A rank that never issued the collective the others wait in is followed as a process of its
own, and the chain ends where its own chain ends."""

LOCK_CODE = re.compile(r"^\s*(?:async\s+)?with\s+([\w.\[\]'\"]+)\s*(?:as\s+\w+\s*)?:|"
                       r"([\w.\[\]]+)\.acquire\(")
QUEUE_CODE = re.compile(r"([\w.\[\]]+)\.(get|put|wait|join)\(")
SUBPROCESS = re.compile(r"/subprocess\.py$")
MP_POPEN = re.compile(r"multiprocessing/popen_\w+\.py$")
"""multiprocessing's process handles (fork, spawn, forkserver): a ``Process.join`` waits
in their ``Popen.wait``."""
POPEN_FORK = re.compile(r"multiprocessing/popen_fork\.py$")
"""The fork start method's handle: a forked child's stack keeps its ``Popen._launch``."""
FORK_CALL = re.compile(r"\bos\.fork\(\)")
THREADING = re.compile(r"/threading\.py$")
REPLACER = re.compile(r"\(_handle_workers\)")
POOL_WORKER_NAME = re.compile(r"PoolWorker-\d+$")
"""multiprocessing.Pool's name of its worker processes ("ForkPoolWorker-3")."""
MAX_DEPTH = 3
"""Threads followed one from another (a join of a thread that joins another ...)."""
TORCH_FILE = re.compile(r"/torch/")
CPP_BUILD = re.compile(r"torch/_inductor/cpp_builder\.py$")
COMPILE_SIDECAR = re.compile(r"torch/_inductor/compile_worker/__main__\.py$")
"""The script of inductor's compile-worker process, in its command line."""
DATALOADER = re.compile(r"/torch/utils/data/")
SLEEP = re.compile(r"\bsleep\(|nanosleep")
TRAILING_COMMENT = re.compile(r"\s+#[^'\"]*$")
SLEEP_SECONDS = re.compile(r"\bsleep\(\s*(\d[\d_]*(?:\.\d+)?)\s*\)")
CHILD_WCHAN = ("do_wait", "wait_consider_task")
FILE_LOCK_WCHAN = re.compile(r"lock_inode_wait|flock|posix_lock|locks_")


@dataclass(frozen=True)
class Hop:
    """One link: its kind (``HOPS``), the sentence, and the line it stands at."""

    kind: str
    text: str
    where: str | None = None
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "where": self.where, "code": self.code}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Hop:
        return cls(str(data["kind"]), str(data["text"]), data.get("where"), data.get("code"))


@dataclass(frozen=True)
class WaitChain:
    """The hops, first the waiting thread; ``end`` (``ENDS``) and ``subject``: the lock,
    queue, path, command or condition the end is about."""

    hops: tuple[Hop, ...]
    end: str
    subject: str | None = None

    def __post_init__(self) -> None:
        if self.end not in ENDS:
            raise ValueError(f"end: must be one of {', '.join(ENDS)}, got {self.end!r}")

    def has(self, kind: str) -> bool:
        return any(hop.kind == kind for hop in self.hops)

    def printed(self) -> str:
        """"waits for X at f:l -> X is held by Y -> Y is doing Z at f:l"."""
        return " -> ".join(hop.text for hop in self.hops)

    def to_dict(self) -> dict[str, Any]:
        return {"hops": [hop.to_dict() for hop in self.hops], "end": self.end,
                "subject": self.subject, "printed": self.printed()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WaitChain:
        return cls(tuple(Hop.from_dict(h) for h in data.get("hops") or ()), str(data["end"]),
                   data.get("subject"))


def at(frame: StackFrame) -> str:
    """"file.py:52" of a frame."""
    return f"{PurePath(frame.file).name}:{frame.line}"


def _at_scope(name: str, line: int) -> str:
    return f"{PurePath(name).name}:{line}"


def _label(thread: ThreadStack) -> str:
    return "the main thread" if thread.name == "MainThread" else \
        f"thread {thread.name or thread.thread_id}"


def _own(thread: ThreadStack) -> StackFrame | None:
    return next((frame for frame in thread.frames if own_code(frame)), None)


def _lock_name(code: str | None) -> str | None:
    match = LOCK_CODE.search(code or "")
    return (match[1] or match[2]) if match else None


def _holds(scopes: Sequence[Scope], thread: ThreadStack, lock: str) -> Scope | None:
    """The scope of ``thread`` inside a ``with lock:`` block, None when none is."""
    return next((scope for scope in scopes if scope.thread_id == thread.thread_id and
                 any(text == lock for text, _ in scope.withs)), None)


def _os_wait(waits: ProcessWaits | None, thread: ThreadStack) -> ThreadWait | None:
    if waits is None:
        return None
    return waits.thread(thread.os_thread_id) or (
        waits.thread(waits.pid) if thread.name == "MainThread" else None)


@dataclass(frozen=True)
class _Process:
    """One process as the chain reads it: its last sample, OS waits, exceptions, role."""

    sample: StackSample
    waits: ProcessWaits | None
    died: tuple[dict[str, Any], ...] = ()
    role: str = "this process"
    forked: bool = False


def _doing(thread: ThreadStack, process: _Process) -> Hop:
    """What a thread that is not waiting on the first one does: its own line."""
    frame = _own(thread) or (thread.python_frames() or [None])[0]
    if frame is None:
        return Hop("unknown", f"{_label(thread)}: where it stands is unknown (no frames)")
    code = f" `{frame.code}`" if frame.code else ""
    state = "waits at" if wait_frame(thread) is not None else "runs"
    return Hop("frame", f"{_label(thread)} {state} {at(frame)}{code}", at(frame), frame.code)


def _lock_chain(process: _Process, thread: ThreadStack, frame: StackFrame, lock: str
                ) -> WaitChain:
    scopes = process.waits.scopes if process.waits else ()
    first = Hop("lock", f"{_label(thread)} waits for `{lock}` at {at(frame)}", at(frame),
                frame.code)
    itself = _holds(scopes, thread, lock)
    if itself is not None:
        line = next(n for text, n in itself.withs if text == lock)
        return WaitChain((first, Hop("holder", f"`{lock}` is held by the same thread, in "
                                               f"{itself.function} (inside `with {lock}:` at "
                                               f"{_at_scope(itself.file, line)}): a lock that "
                                               f"is not reentrant, taken twice",
                                     _at_scope(itself.file, line))), "lock-self", lock)
    holders = [(other, scope) for other in user_threads(process.sample)
               if other is not thread and (scope := _holds(scopes, other, lock))]
    if not holders:
        if process.waits is None:
            return WaitChain((first, Hop("unknown", f"who holds `{lock}` is unknown (the "
                                                    f"stall's scopes were not read)")),
                             "unknown", lock)
        if process.forked:
            return WaitChain((first, Hop("holder", f"`{lock}` is held by no thread of "
                                                   f"{process.role}: it was locked when the "
                                                   f"process was forked, by a thread that "
                                                   f"does not exist in the copy")),
                             "lock-lost-fork", lock)
        return WaitChain((first, Hop("holder", f"no live thread is inside a `with {lock}:` "
                                               f"block: it was acquired and never released, "
                                               f"or by a thread that has ended")),
                         "lock-lost", lock)
    holder, scope = holders[0]
    line = next(n for text, n in scope.withs if text == lock)
    second = Hop("holder", f"`{lock}` is held by {_label(holder)} (inside `with {lock}:` at "
                           f"{_at_scope(scope.file, line)})", _at_scope(scope.file, line))
    held_frame = wait_frame(holder)
    own = _own(holder)
    other_lock = _lock_name(own.code) if own is not None and held_frame is not None else None
    mine = _holds(scopes, thread, other_lock) if other_lock is not None else None
    if mine is not None:
        inside = _at_scope(mine.file, next(n for text, n in mine.withs if text == other_lock))
        return WaitChain((first, second, Hop(
            "lock", f"{_label(holder)} waits for `{other_lock}` at {at(own)}, which "
                    f"{_label(thread)} holds (inside `with {other_lock}:` at {inside}): each "
                    f"waits for the other", at(own), own.code)),
            "lock-cycle", f"{lock}` and `{other_lock}")
    queued = QUEUE_CODE.search(own.code or "") if own is not None else None
    if held_frame is not None and own is not None and queued and queued[2] == "put":
        return WaitChain((first, second, Hop(
            "queue", f"{_label(holder)} waits in `{queued[1]}.put` at {at(own)} (the queue "
                     f"is full) while it holds `{lock}`", at(own), own.code)),
            "queue-full", lock)
    return WaitChain((first, second, _doing(holder, process)), "lock-held", lock)


def _queue_chain(process: _Process, thread: ThreadStack, own: StackFrame, name: str,
                 method: str) -> WaitChain:
    what = {"get": f"an item from `{name}`", "wait": f"`{name}` to be set or notified",
            "join": f"`{name}` to finish", "put": f"room in `{name}`"}[method]
    first = Hop("queue", f"{_label(thread)} waits for {what} at {at(own)}", at(own), own.code)
    if process.died:
        record = process.died[-1]
        where = f" at {record['where']}" if record.get("where") else ""
        return WaitChain((first, Hop("producer", f"thread {record.get('thread') or '?'} died "
                                                 f"of {record.get('type')}: "
                                                 f"{record.get('message')}{where}")),
                         "producer-died", name)
    others = [t for t in user_threads(process.sample) if t is not thread]
    if not others:
        return WaitChain((first, Hop("producer", "no other thread of the process is alive "
                                                 "to feed it")), "no-producer", name)
    return WaitChain((first, Hop("producer", "which thread feeds it is unknown; the other "
                                             "live threads: " + "; ".join(
                                                 _doing(t, process).text for t in others))),
                     "no-producer", name)


def _command(waits: ProcessWaits) -> str:
    return " ".join(waits.command) or f"pid {waits.pid}"


def _read_file(waits: ProcessWaits | None, os_wait: ThreadWait | None) -> OpenFile | None:
    """The open file a thread blocked in a read is reading; None when it is not in one."""
    if waits is None or os_wait is None or os_wait.syscall_name not in READ_SYSCALLS:
        return None
    return waits.file(os_wait.first_arg)


def _pipe_writer(waits: ProcessWaits | None, os_wait: ThreadWait | None
                 ) -> ProcessWaits | None:
    """The child holding the write end of the pipe the thread is blocked reading (its
    output, which the thread reads to the end); None when the read is not of such a pipe."""
    read = _read_file(waits, os_wait)
    if waits is None or read is None or not read.is_pipe:
        return None
    return next((child for child in waits.children
                 if any(f.inode == read.inode and "w" in f.mode for f in child.files)), None)


def _in_compile(thread: ThreadStack) -> tuple[str, bool] | None:
    """Where torch.compile stands in ``thread`` (" inside torch.compile (f at file:line)",
    its innermost torch frame) and whether that is its C++ build; None when the thread is
    not compiling."""
    frames = thread.python_frames()  # innermost first
    cxx = any(CPP_BUILD.search(f.file) for f in frames)
    if compiler_frame((f.function, f.file, f.line) for f in reversed(frames)) is None:
        # a compile worker (process or thread) runs the C++ build with none of the
        # compiler's entry frames on its stack
        build = next((f for f in frames if CPP_BUILD.search(f.file)), None)
        return (f" in torch.compile's C++ build ({build.function} at {at(build)})", True) \
            if build is not None else None
    inner = next((f for f in frames if TORCH_FILE.search(f.file)), None)
    if inner is None:
        return None
    return f" inside torch.compile ({inner.function} at {at(inner)})", cxx


def _child_chain(process: _Process, thread: ThreadStack, own: StackFrame | None,
                 reading: ProcessWaits | None = None, others: Sequence[_Process] = (),
                 depth: int = 0) -> WaitChain:
    """The chain of a wait for a child: to exit, or (``reading``) to end the output this
    thread reads from it; a child blocked writing into a pipe that this process holds the
    read end of, and does not read while it waits, is a cycle (``pipe-unread``)."""
    waits = process.waits
    where = f" at {at(own)}" if own is not None else ""
    os_wait = _os_wait(waits, thread)
    children = waits.children if waits else ()
    waited = next((c for c in children if os_wait and c.pid == os_wait.first_arg), None)
    child = reading or waited or (children[0] if len(children) == 1 else None)
    compiling = _in_compile(thread)
    inside = compiling[0] if compiling else ""
    if child is None:
        return WaitChain((Hop("child", f"{_label(thread)} waits for a child process"
                                       f"{inside}{where}",
                              at(own) if own else None, own.code if own else None),
                          Hop("unknown", "which child, and what it waits on, is unknown")),
                         "unknown")
    waits_for = (f"waits to read the output of child pid {child.pid} (`{_command(child)}`)"
                 if reading is not None else
                 f"waits for child pid {child.pid} (`{_command(child)}`) to exit")
    first = Hop("child", f"{_label(thread)} {waits_for}{inside}{where}",
                at(own) if own else None, own.code if own else None)
    main = child.thread(child.pid) or (child.threads[0] if child.threads else None)
    waiting_end = "child-waits" if compiling is None else \
        "compile-cxx" if compiling[1] else "compile-child"
    if main is None:
        return WaitChain((first, Hop("unknown", f"what pid {child.pid} waits on is unknown")),
                         "unknown", _command(child))
    unread = _unread_pipe(child, waits)
    if unread is not None and reading is None:
        tid, written = unread
        name = _thread_name(others, child.pid, tid)
        who = f"thread {name}" if name else f"thread {tid}"
        queue = bool(name and "Feeder" in name)
        return WaitChain((first, Hop(
            "process", f"{who} of pid {child.pid} is blocked writing into {written.target}, a "
                    f"pipe whose read end this process holds and does not read while it "
                    f"waits: the child cannot exit before its data is read"
                    + (" (a multiprocessing.Queue's feeder thread flushes what was put on "
                       "the queue before its process exits)" if queue else ""))),
            "pipe-unread", "multiprocessing.Queue" if queue else written.target)
    reads = main.syscall_name in READ_SYSCALLS
    read = child.file(main.first_arg) if reads else None
    stream = " (its stdin)" if reads and main.first_arg == 0 else ""
    if read is not None:
        ours = [f for f in (waits.files if waits else ()) if read.is_pipe and
                f.inode == read.inode and "w" in f.mode]
        if ours:
            return WaitChain((first, Hop("pipe", f"pid {child.pid} is blocked reading fd "
                                                 f"{main.first_arg}{stream}, {read.target}, a "
                                                 f"pipe whose write end this process holds "
                                                 f"(fd {ours[0].fd}) and never closed: it "
                                                 f"never reaches end of file")),
                             "pipe-eof", _command(child))
    if compiling is None:
        inner = _sampled_child_chain(process, child, others, depth)
        if inner is not None:
            return WaitChain((first, *inner.hops), inner.end, inner.subject)
    if reads:
        target = read.target if read is not None else "an unknown descriptor"
        return WaitChain((first, Hop("process", f"pid {child.pid} is blocked reading fd "
                                                f"{main.first_arg}{stream} ({target})")),
                         waiting_end, _command(child))
    kernel = main.wchan or main.syscall_name or "an unknown place"
    return WaitChain((first, Hop("process", f"pid {child.pid} waits in the kernel at "
                                            f"{kernel}")), waiting_end, _command(child))


def _forked(child: ProcessWaits, parent: _Process, sample: StackSample) -> bool:
    """Whether ``child`` is a copy of the parent made by fork without an exec: its stack
    holds the call that forked it (multiprocessing's fork start method, or ``os.fork()`` in
    the user's code, both copied from the parent), or it runs the parent's very command."""
    if parent.waits is not None and child.command and child.command == parent.waits.command:
        return True
    return any(POPEN_FORK.search(f.file) and f.function.endswith("_launch") or
               FORK_CALL.search(f.code or "") for t in sample.threads for f in t.frames)


def _sampled_child_chain(process: _Process, child: ProcessWaits, others: Sequence[_Process],
                         depth: int) -> WaitChain | None:
    """The chain of a child the waiting thread waits for, followed into the child's own
    threads when the child was sampled at the stall (a Python process of the job): its
    hops, each naming the child; None when it was not sampled or names no line of its
    own. A child forked without an exec is a copy of this process, and a lock no thread
    of it holds was locked by a thread that was not copied."""
    sampled = next((o for o in others if o.sample.pid == child.pid), None)
    if sampled is None or depth >= MAX_DEPTH:
        return None
    start = _start(sampled.sample)
    if start is None:
        return None
    forked = sampled.forked or _forked(child, process, sampled.sample)
    copy = _Process(sampled.sample, sampled.waits or child, sampled.died,
                    f"pid {child.pid}" + (", a forked copy of this process" if forked and
                                          not sampled.forked else ""), forked)
    inner = _thread_chain(copy, start, [o for o in others if o is not sampled], depth + 1)
    if inner.end == "unknown" and _own(start) is None:  # no line of the user's to name
        return None
    head = inner.hops[0]
    named = Hop(head.kind, f"in pid {child.pid}" + (" (forked from this process, no exec)"
                                                    if forked else "") +
                f", {head.text}", head.where, head.code)
    return WaitChain((named, *inner.hops[1:]), inner.end, inner.subject)


def _unread_pipe(child: ProcessWaits, waits: ProcessWaits | None
                 ) -> tuple[int, OpenFile] | None:
    """(tid, pipe) of a thread of ``child`` blocked writing into a pipe whose read end the
    waiting process (``waits``) holds; None when none is."""
    if waits is None:
        return None
    for thread in child.threads:
        if not ("pipe_write" in (thread.wchan or "") or thread.syscall_name == "write"):
            continue
        written = child.file(thread.first_arg)
        if written is not None and written.is_pipe and any(
                f.inode == written.inode and "r" in f.mode for f in waits.files):
            return thread.tid, written
    return None


def _thread_name(others: Sequence[_Process], pid: int, tid: int) -> str | None:
    """The name a sampled process gives its thread ``tid`` (None when not sampled)."""
    for other in others:
        if other.sample.pid == pid:
            for thread in other.sample.threads:
                if thread.os_thread_id == tid:
                    return thread.name
    return None


def _held_pipe_chain(process: _Process, thread: ThreadStack, own: StackFrame | None,
                     read: OpenFile, held: Sequence[PipeWriter]) -> WaitChain:
    """A read of a pipe whose write end no child holds: a subprocess's output whose child
    ended (its only child, and the read in subprocess's code) while another process keeps
    the write end open; else the read and the holders."""
    where = f" at {at(own)}" if own is not None else ""
    waits = process.waits
    ended = waits.ended if waits is not None else ()
    child = ended[0] if len(ended) == 1 and waits is not None and not waits.children and \
        any(SUBPROCESS.search(f.file) for f in thread.python_frames()) else None
    holders = "; ".join(f"pid {w.pid} (`{short_command(w.command) or '?'}`, fd {w.fd})"
                        for w in held)
    subject = short_command(held[0].command) or f"pid {held[0].pid}"
    if child is None:
        return WaitChain((Hop("pipe", f"{_label(thread)} waits to read fd {read.fd}, "
                                      f"{read.target}{where}", at(own) if own else None,
                              own.code if own else None),
                          Hop("pipe", f"its write end is open in {holders}: the read never "
                                      f"reaches end of file while it is")), "pipe-held",
                         subject)
    name = f" (`{child.name}`)" if child.name else ""
    return WaitChain((Hop("child", f"{_label(thread)} waits to read the output of child pid "
                                   f"{child.pid}{name}{where}", at(own) if own else None,
                          own.code if own else None),
                      Hop("ended", f"pid {child.pid} ended ({child.status()})"),
                      Hop("pipe", f"but the write end of its output ({read.target}) is still "
                                  f"open in {holders}: the read never reaches end of file "
                                  f"while it is")), "pipe-held", subject)


def _connection(end: SocketEnd) -> str:
    if end.protocol == "unix":
        return f"a Unix socket{f' ({end.local})' if end.local else ''}"
    if end.protocol == "unknown":
        return "a socket"
    kind = "UDP socket" if end.protocol == "udp" else "TCP connection"
    state = f", {end.state}" if end.state and end.state != "ESTABLISHED" else ""
    return f"a {kind} from {end.local} to {end.remote}{state}"


def short_command(argv: Sequence[str]) -> str:
    """A command as a person names it: each path by its last part ("python serve.py 80"
    for "/venv/bin/python /home/u/serve.py 80")."""
    return " ".join(PurePath(arg).name if "/" in arg and not arg.endswith("/") else arg
                    for arg in argv)


def _socket_chain(process: _Process, thread: ThreadStack, own: StackFrame | None,
                  end: SocketEnd, others: Sequence[_Process]) -> WaitChain:
    where = f" at {at(own)}" if own is not None else ""
    first = Hop("socket", f"{_label(thread)} waits to read fd {end.fd}, {_connection(end)}"
                          f"{where}", at(own) if own else None, own.code if own else None)
    if end.peer_pid is None and end.protocol not in ("tcp", "tcp6", "udp"):
        return WaitChain((first, Hop("unknown", "which process holds the other end is "
                                                "unknown (/proc does not name the peer of "
                                                "this kind of socket)")), "unknown")
    if end.peer_pid is None:
        sight = "is held by no process this machine shows (another container or namespace)" \
            if end.on_this_machine else "is on another machine: what it does is not " \
                                        "visible from here"
        return WaitChain((first, Hop("peer", f"the other end, {end.remote}, {sight}")),
                         "socket-remote", end.remote)
    command = short_command(end.peer_command) or f"pid {end.peer_pid}"
    itself = end.peer_pid == process.sample.pid
    holder = f"this same process (pid {end.peer_pid}): one of its own threads must write " \
             f"to it" if itself else f"pid {end.peer_pid} (`{command}`)"
    second = Hop("peer", f"the other end ({end.remote}) is held by {holder}")
    sampled = next((p for p in others if p.sample.pid == end.peer_pid), None)
    main = _main(sampled.sample) if sampled is not None else None
    if itself:
        return WaitChain((first, second), "socket-peer", command)
    if main is not None:
        doing = _doing(main, sampled)
        text = doing.text
        frame = _own(main)
        if end.peer_reads_it and frame is not None:  # a read the stack alone calls running
            text = (f"{_label(main)} waits to read the same connection at {at(frame)}"
                    f"{f' `{frame.code}`' if frame.code else ''}: each end waits for the "
                    f"other to send")
        return WaitChain((first, second, Hop(doing.kind, f"pid {end.peer_pid}: {text}",
                                             doing.where, doing.code)), "socket-peer", command)
    wait = end.peer_wait
    kernel = wait.wchan or wait.syscall_name if wait is not None else None
    third = Hop("process", f"pid {end.peer_pid}'s main thread waits in the kernel at {kernel} "
                           f"(its Python stack was not sampled)") if kernel else \
        Hop("unknown", f"where pid {end.peer_pid} stands is unknown (it was not sampled)")
    return WaitChain((first, second, third), "socket-peer", command)


def _file_lock_chain(process: _Process, thread: ThreadStack, own: StackFrame | None,
                     others: Sequence[_Process]) -> WaitChain | None:
    waits = process.waits
    if waits is None:
        return None
    mine = [lock for lock in waits.locks if lock.pid == waits.pid and lock.blocked]
    held = [lock for lock in waits.locks if not lock.blocked and lock.pid != waits.pid and
            (not mine or lock.inode == mine[0].inode)]
    if not held:
        return None
    lock = held[0]
    where = f" at {at(own)}" if own is not None else ""
    first = Hop("file-lock", f"{_label(thread)} waits for the {lock.kind.lower()} lock on "
                             f"{lock.path}{where}", at(own) if own else None,
                own.code if own else None)
    holder = next((p for p in others if p.sample.pid == lock.pid), None)
    command = f" (`{_command(holder.waits)}`)" if holder and holder.waits and \
        holder.waits.command else ""
    second = Hop("holder", f"it is held ({lock.access.lower()}) by pid {lock.pid}{command}, "
                           f"by /proc/locks")
    if holder is None:
        return WaitChain((first, second, Hop("unknown", f"what pid {lock.pid} is doing is "
                                                        f"unknown (it was not sampled)")),
                         "file-lock", lock.path)
    main = _main(holder.sample)
    if main is None:
        return WaitChain((first, second, Hop("unknown", f"where pid {lock.pid} stands is "
                                                        f"unknown")), "file-lock", lock.path)
    doing = _doing(main, holder)
    return WaitChain((first, second, Hop(doing.kind, f"pid {lock.pid}: {doing.text}",
                                         doing.where, doing.code)), "file-lock", lock.path)


def _main(sample: StackSample) -> ThreadStack | None:
    threads = user_threads(sample)
    return next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)


def _poll_chain(process: _Process, thread: ThreadStack) -> WaitChain | None:
    """A loop around a sleep in the user's own frame: what its condition polls."""
    scopes = process.waits.scopes if process.waits else ()
    own = _own(thread)
    sleeping = own is not None and bool(SLEEP.search(own.code or "")) or any(
        SLEEP.search(f.function) for f in thread.frames if f.is_native)
    scope = next((s for s in scopes if s.thread_id == thread.thread_id and own is not None
                  and s.file == own.file and s.line == own.line), None)
    if not sleeping:
        return None
    if scope is None or scope.loop is None or not scope.loop[0].startswith("while"):
        # a sleep in straight code or in a `for` loop waits for its time, not for a condition
        return _sleep_chain(thread, own)
    header, line = scope.loop
    condition = header.removeprefix("while ").removesuffix(":")
    return WaitChain((Hop("poll", f"{_label(thread)} polls `{condition}` in a sleep loop at "
                                  f"{_at_scope(scope.file, line)}, still looping at the stall",
                          _at_scope(scope.file, line), header),), "poll", condition)


def _sleep_chain(thread: ThreadStack, own: StackFrame | None) -> WaitChain | None:
    """A sleep written in the user's own line (not in a polling loop): the line, and the
    time it asks for when that is a number written there."""
    if own is None or not own.code or not SLEEP.search(own.code):
        return None
    literal = SLEEP_SECONDS.search(own.code)
    asked = f" ({float(literal[1].replace('_', '')):g} s, as written)" if literal else ""
    call = TRAILING_COMMENT.sub("", own.code)
    return WaitChain((Hop("sleep", f"{_label(thread)} sleeps at {at(own)} `{own.code}`{asked}",
                          at(own), own.code),), "sleep", call)


def _worker_chain(process: _Process, thread: ThreadStack, own: StackFrame | None,
                  others: Sequence[_Process]) -> WaitChain:
    where = f" at {at(own)}" if own is not None else ""
    first = Hop("worker", f"{_label(thread)} waits for a batch from the DataLoader{where}",
                at(own) if own else None, own.code if own else None)
    workers = [p for p in others if "DataLoader worker" in p.role]
    if not workers:
        return WaitChain((first, Hop("unknown", "no DataLoader worker was sampled: which one "
                                                "holds it up is unknown")), "unknown")
    worker = workers[0]
    main = _main(worker.sample)
    if main is None:
        return WaitChain((first, Hop("unknown", f"where {worker.role} stands is unknown")),
                         "unknown")
    inner = _thread_chain(worker, main, ())
    hops = (first, Hop(inner.hops[0].kind, f"{worker.role} (pid {worker.sample.pid}) "
                                 f"{_strip(inner.hops[0].text, main)}", inner.hops[0].where,
                       inner.hops[0].code), *inner.hops[1:])
    return WaitChain(hops, inner.end if inner.end != "unknown" else "worker", inner.subject)


def _runs_task(thread: ThreadStack) -> bool:
    """Whether a pool worker's loop thread is inside a task: a frame of the user's code
    inside the worker loop (a forked worker's stack also holds, outside the loop, the
    parent's frames that created the pool)."""
    for frame in thread.frames:  # innermost first
        if is_pool_worker_loop(frame):
            return False
        if own_code(frame):
            return True
    return False


def _pool_chain(process: _Process, thread: ThreadStack, own: StackFrame | None,
                others: Sequence[_Process], depth: int) -> WaitChain:
    """A wait for a multiprocessing pool's results: a worker that runs a task is followed;
    every worker idle means the task is held by none (a worker that ended took it: the pool
    starts another in its place and never returns the task)."""
    where = f" at {at(own)}" if own is not None else ""
    first = Hop("pool", f"{_label(thread)} waits for the results of a multiprocessing pool"
                        f"{where}", at(own) if own else None, own.code if own else None)
    workers = [(p, t) for p in others if (t := pool_worker_thread(p.sample)) is not None]
    if not workers:
        return WaitChain((first, Hop("unknown", "no worker of the pool was sampled: where "
                                                "they stand is unknown")), "unknown")
    busy = [(p, t) for p, t in workers if _runs_task(t)]
    if busy and depth < MAX_DEPTH:
        worker, loop = busy[0]
        inner = _thread_chain(worker, loop, (), depth + 1)
        said = f"pool worker pid {worker.sample.pid} {_strip(inner.hops[0].text, loop)}"
        hops = (first, Hop(inner.hops[0].kind, said, inner.hops[0].where,
                           inner.hops[0].code), *inner.hops[1:])
        return WaitChain(hops, inner.end if inner.end != "unknown" else "pool-worker",
                         inner.subject)
    pids = ("pid " if len(workers) == 1 else "pids ") + \
        ", ".join(str(p.sample.pid) for p, _ in workers)
    # a worker the pool started after its first ones inherits the name of the pool's
    # thread that starts the replacements
    replaced = [p.sample.pid for p, t in workers if REPLACER.search(t.name or "")]
    lost = _lost_workers(process)
    if lost:
        return WaitChain((first, _ended_workers(lost, replaced, len(workers))),
                         "pool-worker-ended",
                         ("pool worker pid " if len(lost) == 1 else "pool workers pids ") +
                         ", ".join(str(e.pid) for e in lost))
    started = (f"; pid {', '.join(map(str, replaced))} was started by the pool's "
               f"`_handle_workers` thread, which replaces a worker that ended"
               if replaced else "")
    noun = {1: "its one worker sampled", 2: "both its workers"}.get(
        len(workers), f"all {len(workers)} of its workers")
    verb = "waits" if len(workers) == 1 else "wait"
    return WaitChain((first, Hop("pool", f"{noun} ({pids}) {verb} idle for a task: none "
                                         f"runs the task whose result this waits for"
                                         f"{started}")), "pool-lost-task")


def _compile_workers(process: _Process, others: Sequence[_Process]
                     ) -> tuple[ProcessWaits | None, list[tuple[_Process, ThreadStack]]]:
    """Inductor's compile-worker process among the children of ``process`` (None when it
    has none), and the sampled processes that run a worker loop of its executor: its
    children, or any process whose command is the same script."""
    children = process.waits.children if process.waits else ()
    sidecar = next((c for c in children if any(COMPILE_SIDECAR.search(arg)
                                               for arg in c.command)), None)
    forked = {c.pid for c in sidecar.children} if sidecar is not None else set()
    workers = []
    for other in others:
        thread = next((t for t in user_threads(other.sample) if executor_job(t) is not None),
                      None)
        command = other.waits.command if other.waits else ()
        if thread is not None and (other.sample.pid in forked or
                                   any(COMPILE_SIDECAR.search(arg) for arg in command)):
            workers.append((other, thread))
    return sidecar, workers


def _compile_pool_chain(process: _Process, thread: ThreadStack, own: StackFrame | None,
                        others: Sequence[_Process], depth: int) -> WaitChain:
    """A wait for a job of torch.compile's compile workers: the worker (a compile thread of
    this process, or a process inductor's compile-worker process forked) that is inside a
    job is followed; every one idle is said so."""
    compiling = _in_compile(thread)
    inside = compiling[0] if compiling else ""
    where = f" at {at(own)}" if own is not None else ""
    sidecar, workers = _compile_workers(process, others)
    threads = [t for t in user_threads(process.sample) if t is not thread and
               executor_job(t) is not None]
    held = f" (inductor's compile-worker process, pid {sidecar.pid})" if sidecar else ""
    first = Hop("compile-pool", f"{_label(thread)} waits for a job of torch.compile's compile "
                                f"workers{held}{inside}{where}",
                at(own) if own else None, own.code if own else None)
    busy_thread = next((t for t in threads if executor_job(t)), None)
    busy = next(((p, t) for p, t in workers if executor_job(t)), None)
    if depth < MAX_DEPTH and (busy_thread is not None or busy is not None):
        owner, runner = (process, busy_thread) if busy_thread is not None else busy
        inner = _thread_chain(owner, runner, others if owner is process else (), depth + 1)
        name = _label(runner) if owner is process else f"compile worker pid {owner.sample.pid}"
        if inner.end == "unknown":  # no wait of a known kind: where its job stands
            return WaitChain((first, _job_hop(owner, runner, name)), "compile-worker")
        said = f"{name} {_strip(inner.hops[0].text, runner)}"
        return WaitChain((first, Hop(inner.hops[0].kind, said, inner.hops[0].where,
                                     inner.hops[0].code), *inner.hops[1:]),
                         inner.end, inner.subject)
    if workers or threads:
        named = ", ".join([f"pid {p.sample.pid}" for p, _ in workers] +
                          [_label(t) for t in threads])
        return WaitChain((first, Hop("compile-pool", f"every compile worker sampled ({named}) "
                                                     f"waits idle for a job: none runs the one "
                                                     f"awaited")), "unknown")
    unseen = "its workers were not sampled" if sidecar else "no compile worker was found"
    return WaitChain((first, Hop("unknown", f"{unseen}: what runs the job is unknown")),
                     "unknown")


def _job_hop(process: _Process, thread: ThreadStack, name: str) -> Hop:
    """Where a compile worker's job stands: its innermost Python frame, and where the
    kernel holds the thread when /proc said."""
    frame = (thread.python_frames() or [None])[0]
    os_wait = _os_wait(process.waits, thread)
    kernel = os_wait.wchan or os_wait.syscall_name if os_wait is not None else None
    held = f", in the kernel at {kernel}" if kernel else ""
    if frame is None:
        return Hop("frame", f"{name} is inside a job{held}")
    code = f" `{frame.code}`" if frame.code else ""
    return Hop("frame", f"{name} is inside its job at {at(frame)}{code}{held}", at(frame),
               frame.code)


def _lost_workers(process: _Process) -> list[EndedProcess]:
    """The pool workers of ``process`` that ended other than by finishing their tasks (a
    worker retired by ``maxtasksperchild`` exits with code 0 and loses nothing)."""
    ended = process.waits.ended if process.waits else ()
    return [e for e in ended if POOL_WORKER_NAME.search(e.name) and e.returncode != 0]


def _ended_workers(lost: Sequence[EndedProcess], replaced: Sequence[int], sampled: int
                   ) -> Hop:
    """"pool worker pid P ended (killed by SIGKILL) while it ran the task; the pool
    replaced it with pid Q, which never gets that task"."""
    said = "; ".join(f"pool worker pid {e.pid} ended ({e.status()})" for e in lost)
    one = len(lost) == 1
    task = "while it ran the task" if one else "and one of them ran the task"
    idle = "the workers it has now wait idle" if sampled > 1 else "its worker now waits idle"
    if replaced:
        them = "it" if one else "them"
        new = ", ".join(map(str, replaced))
        never = "which never gets" if len(replaced) == 1 else "which never get"
        return Hop("ended", f"{said} {task}; the pool replaced {them} with pid {new}, {never} "
                            f"that task ({idle})")
    return Hop("ended", f"{said} {task}; {idle}, and none gets that task")


def _strip(text: str, thread: ThreadStack) -> str:
    return text.removeprefix(_label(thread) + " ")


def _terminal_read(waits: ProcessWaits | None, os_wait: ThreadWait | None) -> OpenFile | None:
    """The terminal the thread is blocked reading (a prompt waiting for its answer); None
    when the read is not of a terminal."""
    read = _read_file(waits, os_wait)
    return read if read is not None and TERMINAL.match(read.target) else None


def _joins_process(thread: ThreadStack) -> bool:
    """Whether the thread waits in a multiprocessing ``Process.join`` (its handle's
    ``Popen.wait``; a forked child's stack also holds the parent's ``Popen._launch``, which
    is no wait)."""
    return any(MP_POPEN.search(f.file) and f.function.rsplit(".", 1)[-1] == "wait"
               for f in thread.python_frames())


def _joins_thread(thread: ThreadStack) -> bool:
    """Whether the thread waits in ``Thread.join`` (threading.py), not a queue's join."""
    return any(THREADING.search(f.file) and f.function.rsplit(".", 1)[-1] in
               ("join", "_wait_for_tstate_lock") for f in thread.python_frames())


def _join_chain(process: _Process, thread: ThreadStack, own: StackFrame, name: str,
                others: Sequence[_Process], depth: int) -> WaitChain:
    """A ``Thread.join``: the thread joined, when the process has one other live thread of
    the user's (which of several is ``name`` is not in the evidence), followed."""
    first = Hop("join", f"{_label(thread)} waits for thread `{name}` to finish at {at(own)}",
                at(own), own.code)
    candidates = [t for t in user_threads(process.sample) if t is not thread]
    if len(candidates) != 1:
        alive = "; ".join(_doing(t, process).text for t in candidates) or "none"
        return WaitChain((first, Hop("unknown", f"which live thread is `{name}` is unknown; "
                                                f"the other live threads: {alive}")),
                         "unknown", name)
    joined = candidates[0]
    if depth >= MAX_DEPTH:
        return WaitChain((first, _doing(joined, process)), "unknown", name)
    inner = _thread_chain(process, joined, others, depth + 1)
    return WaitChain((first, *inner.hops), inner.end, inner.subject)


def _thread_chain(process: _Process, thread: ThreadStack, others: Sequence[_Process],
                  depth: int = 0) -> WaitChain:
    """The chain from ``thread`` of ``process`` (see the module docstring); ``depth`` counts
    the threads already followed to reach it (a join leads to the joined thread)."""
    frame = wait_frame(thread)
    own = _own(thread)
    lock = _lock_name(own.code) if own is not None else None
    if lock is not None and frame is not None:
        return _lock_chain(process, thread, own, lock)
    os_wait = _os_wait(process.waits, thread)
    if os_wait is not None and (os_wait.syscall_name == "flock" or FILE_LOCK_WCHAN.search(
            os_wait.wchan or "")):
        found = _file_lock_chain(process, thread, own, others)
        if found is not None:
            return found
    writer = _pipe_writer(process.waits, os_wait)
    # a thread whose kernel wait was not matched to it (a sample without thread ids) but
    # which stands in subprocess's code waits for a child too
    if (any(SUBPROCESS.search(f.file) for f in thread.python_frames()) or
            _joins_process(thread)) and \
            (frame is not None or writer is not None or
             os_wait is None and process.waits is not None and process.waits.children) \
            or os_wait is not None and (os_wait.syscall_name in ("wait4", "waitid") or
                                        os_wait.wchan in CHILD_WCHAN):
        return _child_chain(process, thread, own, writer, others, depth)
    if frame is not None and awaits_inductor_job(thread):
        return _compile_pool_chain(process, thread, own, others, depth)
    if frame is not None and any(DATALOADER.search(f.file) for f in thread.python_frames()):
        return _worker_chain(process, thread, own, others)
    if frame is not None and any(POOL_FILE.search(f.file) for f in thread.python_frames()):
        return _pool_chain(process, thread, own, others, depth)
    if frame is not None and _awaits_future(thread):
        return _future_chain(process, thread, own, others, depth)
    if writer is not None:  # a pipe a child writes, read outside subprocess (os.read, ...)
        return _child_chain(process, thread, own, writer, others, depth)
    read = _read_file(process.waits, os_wait) if writer is None else None
    held = [w for w in process.waits.pipe_writers if read is not None and read.is_pipe and
            w.inode == read.inode] if process.waits is not None else []
    if held:
        return _held_pipe_chain(process, thread, own, read, held)
    terminal = _terminal_read(process.waits, os_wait)
    if terminal is not None:
        where = f" at {at(own)}" if own is not None else ""
        stream = ", its stdin" if terminal.fd == 0 else ""
        return WaitChain((Hop("terminal", f"{_label(thread)} waits for a line typed at the "
                                          f"terminal ({terminal.target}, fd {terminal.fd}"
                                          f"{stream}){where}", at(own) if own else None,
                              own.code if own else None),), "terminal-input", terminal.target)
    socket_end = process.waits.socket(os_wait.first_arg) if process.waits and os_wait and \
        os_wait.syscall_name in READ_SYSCALLS else None
    if socket_end is not None:
        return _socket_chain(process, thread, own, socket_end, others)
    queued = QUEUE_CODE.search(own.code or "") if own is not None else None
    if queued and frame is not None and queued[2] == "join" and _joins_thread(thread):
        return _join_chain(process, thread, own, queued[1], others, depth)
    if queued and frame is not None:
        return _queue_chain(process, thread, own, queued[1], queued[2])
    polled = _poll_chain(process, thread)
    if polled is not None:
        return polled
    here = own or frame
    if here is None:
        return WaitChain((Hop("unknown", f"{_label(thread)}: where it waits is unknown"),),
                         "unknown")
    code = f" `{here.code}`" if here.code else ""
    verb = "waits at" if frame is not None else "stands at"
    return WaitChain((Hop("frame", f"{_label(thread)} {verb} {at(here)}{code}", at(here),
                          here.code),
                      Hop("unknown", "what would release it is not named by the evidence")),
                     "unknown")


# ---- futures: concurrent.futures and asyncio ---------------------------------------------

FUTURE_FILE = re.compile(r"concurrent/futures/_base\.py$")
EXECUTOR_WORKER_FILE = re.compile(r"concurrent/futures/thread\.py$")
EVENT_LOOP_FILE = re.compile(r"asyncio/(?:events|base_events)\.py$")
QUEUE_FILE = re.compile(r"/queue\.py$")


def _awaits_future(thread: ThreadStack) -> bool:
    """Whether the thread waits in ``concurrent.futures.Future.result`` (asyncio's
    ``run_coroutine_threadsafe`` gives one too)."""
    return any(FUTURE_FILE.search(f.file) and f.function.endswith("result")
               for f in thread.python_frames())


def _executor_worker(thread: ThreadStack) -> bool:
    """Whether the thread is a worker of a ``ThreadPoolExecutor`` (its ``_worker`` loop is
    at the bottom of its stack)."""
    return any(EXECUTOR_WORKER_FILE.search(f.file) and f.function == "_worker"
               for f in thread.python_frames())


def _pool_name(thread: ThreadStack) -> str:
    """The pool a worker belongs to, by its thread name ("ThreadPoolExecutor-0_1" is worker
    1 of pool "ThreadPoolExecutor-0"; a thread_name_prefix names it its own way)."""
    name = thread.name or ""
    return name.rsplit("_", 1)[0] if "_" in name else name or "the pool"


def _idle_worker(thread: ThreadStack) -> bool:
    """A pool worker with no task: waiting for the next work item in its queue."""
    python = [f for f in thread.python_frames() if not THREADING.search(f.file)]
    return bool(python) and (QUEUE_FILE.search(python[0].file) is not None or
                             EXECUTOR_WORKER_FILE.search(python[0].file) is not None)


def _future_chain(process: _Process, thread: ThreadStack, own: StackFrame | None,
                  others: Sequence[_Process], depth: int) -> WaitChain:
    """A wait for a future's result: on the thread that runs the asyncio event loop (the
    loop that would run the coroutine is the one waiting); else the thread pool's workers,
    all taken by tasks that wait for futures themselves (starvation), or the one running a
    task, followed."""
    where = at(own) if own is not None else None
    first = Hop("future", f"{_label(thread)} waits for a future's result" +
                (f" at {where}" if where else ""), where, own.code if own else None)
    if any(EVENT_LOOP_FILE.search(f.file) for f in thread.python_frames()):
        return WaitChain((first, Hop(
            "holder", f"{_label(thread)} is the thread that runs the asyncio event loop "
                      f"(its stack holds the loop's own frames below this wait): the "
                      f"coroutine behind the future needs that loop, which is blocked in "
                      f"this wait")), "loop-self", where)
    workers = [t for t in user_threads(process.sample)
               if t is not thread and _executor_worker(t)]
    if _executor_worker(thread):  # a task waiting inside its own pool: that pool's workers
        workers = [t for t in workers if _pool_name(t) == _pool_name(thread)] + [thread]
    if not workers:
        return WaitChain((first, Hop("unknown", "no thread pool worker of this process runs "
                                                "the task it waits for")), "unknown")
    busy = [t for t in workers if not _idle_worker(t)]
    if busy and all(_awaits_future(t) for t in busy) and len(busy) == len(workers):
        names = ", ".join(t.name or str(t.thread_id) for t in busy)
        inner = next((o for t in busy if t is not thread and (o := _own(t)) is not None),
                     None) or own
        pool = _pool_name(busy[0])
        return WaitChain((first, Hop(
            "pool", f"every worker of {pool} ({len(busy)}: {names}) runs a task that itself "
                    f"waits for a future" + (f" at {at(inner)}" if inner else "") +
                    ": the tasks they wait for are queued behind them in the same pool, "
                    "and no worker is left to run them", at(inner) if inner else None,
                    inner.code if inner else None)), "pool-starved", pool)
    running = next((t for t in busy if not _awaits_future(t)), None)
    if running is not None and depth < MAX_DEPTH:
        step = _doing(running, process)
        rest = _thread_chain(process, running, others, depth + 1)
        if rest.end != "unknown":
            return WaitChain((first, Hop("pool", f"{step.text} (a worker of "
                                                 f"{_pool_name(running)})", step.where,
                                         step.code), *rest.hops), rest.end, rest.subject)
        return WaitChain((first, Hop("pool", f"{step.text} (a worker of "
                                             f"{_pool_name(running)}): the task, still "
                                             f"running", step.where, step.code)),
                         "pool-worker", _pool_name(running))
    return WaitChain((first, Hop("unknown", "no worker of the pool runs a task: the task "
                                            "this future stands for is not running")),
                     "unknown")


def _process(stall: StallEvidence | None, died: Sequence[dict[str, Any]] = (),
             role: str = "this process") -> _Process | None:
    if stall is None or not stall.samples:
        return None
    return _Process(stall.samples[-1], stall.waits, tuple(died), role,
                    forked="DataLoader worker" in role)


def _start(sample: StackSample) -> ThreadStack | None:
    """The thread the chain starts from: the main thread when it waits or is the only
    one, else the first user thread that waits."""
    threads = user_threads(sample)
    waiting = [t for t in threads if wait_frame(t) is not None]
    main = next((t for t in threads if t.name == "MainThread"), None)
    if main is not None and (wait_frame(main) is not None or not waiting):
        return main
    return (waiting or threads or [None])[0]


def stall_chain(stall: StallEvidence | None, died: Sequence[dict[str, Any]] = (),
                others: Sequence[dict[str, Any]] = ()) -> WaitChain | None:
    """The wait chain of a stalled process: its stall evidence, the exceptions that ended
    its other threads (``died``) and the other processes of the job sampled at the stall
    (``others``: Evidence.others); None without a stack sample."""
    stopped = _stopped_chain(stall)
    if stopped is not None:
        return stopped
    process = _process(stall, died)
    if process is None:
        return None
    thread = _start(process.sample)
    if thread is None:
        return None
    sampled = [p for p in (_process(StallEvidence.from_dict(o["stall"]), (), str(o.get("role")))
                           for o in others if o.get("stall")) if p is not None]
    return _thread_chain(process, thread, sampled)


def _stopped_chain(stall: StallEvidence | None) -> WaitChain | None:
    """The chain of a process that is stopped rather than waiting (ProcessWaits.stopped):
    who can resume it, then where its main thread stands when a sample was taken."""
    waits = stall.waits if stall is not None else None
    stopped = waits.stopped if waits is not None else None
    if waits is None or stopped is None:
        return None
    pid = waits.pid
    if stopped.tracer_pid:
        tracer = " ".join(stopped.tracer_command)[:120] or "command unknown"
        first = Hop("process", f"pid {pid} is held stopped by its tracer, pid "
                               f"{stopped.tracer_pid} (`{tracer}`): it runs again only when "
                               f"the tracer continues it or detaches")
        subject = f"tracer pid {stopped.tracer_pid}"
    else:
        first = Hop("process", f"pid {pid} is stopped (state {stopped.state}): nothing in it "
                               f"runs or waits; a SIGSTOP, SIGTSTP (Ctrl-Z), SIGTTIN or "
                               f"SIGTTOU stopped it, and only SIGCONT resumes it")
        subject = f"pid {pid}"
    hops = [first]
    if stall is not None and stall.samples:
        main = _start(stall.samples[-1])
        if main is not None:
            hops.append(_doing(main, _Process(stall.samples[-1], waits)))
    return WaitChain(tuple(hops), "stopped", subject)


def wait_chain(evidence: Evidence) -> WaitChain | None:
    """The wait chain of a stalled process's evidence (``stall_chain``)."""
    return stall_chain(evidence.stall, evidence.thread_exceptions, evidence.others)


CHAIN_REASON = "wait chain: "


def add_chain(verdict: Verdict, chain: WaitChain | None) -> None:
    """Put a DEADLOCK's chain, or a STALL-BUSY's that names what it spins on, into the
    verdict's facts ("wait_chain") and its sentence second among its reasons (replacing
    one built from less evidence). A busy process whose chain ends unknown has nothing to
    wait for, and gets none."""
    if chain is None or verdict.name not in ("DEADLOCK", "STALL-BUSY") or \
            verdict.name == "STALL-BUSY" and chain.end == "unknown":
        return
    verdict.facts = verdict.facts.with_facts(wait_chain=chain.to_dict())
    sentence = CHAIN_REASON + chain.printed()
    index = next((i for i, r in enumerate(verdict.reasons) if r.startswith(CHAIN_REASON)),
                 None)
    if index is None:
        verdict.reasons.insert(1, sentence)
    else:
        verdict.reasons[index] = sentence
