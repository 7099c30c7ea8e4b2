"""Children and their exits: ``Popen.wait``/``subprocess.run``, a multiprocessing
``Process.join`` (or the kernel's ``wait4``), or a read of a pipe whose write end a child
holds (its output, read to the end).

The child (pid, command) is named and, when it was sampled at the stall (a Python process
of the job) and its stack names a line of the user's, followed into its own threads: its
chain, each hop naming it. A child forked without an exec is a copy of this process, and a
lock no thread of it holds was locked by a thread that was not copied. Otherwise: where the
kernel holds it; a child reading a pipe whose write end this process holds is a pipe that
never reaches end of file; a child blocked writing into a pipe this process holds the read
end of, and does not read while it waits, cannot exit (a multiprocessing.Queue joined
before it is read). Inside torch.compile the child is the program the compiler runs (its
C++ compiler).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.verdict.waits.model import (
    SUBPROCESS,
    End,
    Family,
    Follow,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    called_at,
    command_of,
    in_compile,
    label,
    os_wait_of,
    said_at,
)
from nsadiag.verdict.waits.processes import follow_child
from nsadiag.waitfacts import READ_SYSCALLS, OpenFile, ProcessWaits

MP_POPEN = re.compile(r"multiprocessing/popen_\w+\.py$")
"""multiprocessing's process handles (fork, spawn, forkserver): a ``Process.join`` waits
in their ``Popen.wait``."""
CHILD_WCHAN = ("do_wait", "wait_consider_task")
JOIN_CALL = re.compile(r"([A-Za-z_][\w.]*)\.join\(")
"""The process a line joins (``worker.join()`` joins ``worker``)."""


def _joins_process(thread: ThreadStack) -> bool:
    """Whether the thread waits in a multiprocessing ``Process.join`` (its handle's
    ``Popen.wait``; a forked child's stack also holds the parent's ``Popen._launch``, which
    is no wait)."""
    return any(MP_POPEN.search(f.file) and f.function.rsplit(".", 1)[-1] == "wait"
               for f in thread.python_frames())


def _child_chain(follow: Follow, process: Proc, thread: ThreadStack, own: StackFrame | None,
                 reading: ProcessWaits | None = None, others: Sequence[Proc] = (),
                 depth: int = 0) -> WaitChain:
    """The chain of a wait for a child: to exit, or (``reading``) to end the output this
    thread reads from it; a child blocked writing into a pipe that this process holds the
    read end of, and does not read while it waits, is a cycle (``pipe-unread``)."""
    waits = process.waits
    where = f" at {at(own)}" if own is not None else ""
    os_wait = os_wait_of(waits, thread)
    children = waits.children if waits else ()
    waited = next((c for c in children if os_wait and c.pid == os_wait.first_arg), None)
    child = reading or waited or (children[0] if len(children) == 1 else None)
    compiling = in_compile(thread)
    inside = compiling[0] if compiling else ""
    if child is None:
        return WaitChain((Hop("child", f"{label(thread)} waits for a child process"
                                       f"{inside}{where}",
                              at(own) if own else None, own.code if own else None),
                          Hop("unknown", "which child, and what it waits on, is unknown")),
                         "unknown")
    waits_for = (f"waits to read the output of child pid {child.pid} (`{command_of(child)}`)"
                 if reading is not None else
                 f"waits for child pid {child.pid} (`{command_of(child)}`) to exit")
    first = Hop("child", f"{label(thread)} {waits_for}{inside}{where}",
                at(own) if own else None, own.code if own else None)
    main = child.thread(child.pid) or (child.threads[0] if child.threads else None)
    waiting_end = "child-waits" if compiling is None else \
        "compile-cxx" if compiling[1] else "compile-child"
    if main is None:
        return WaitChain((first, Hop("unknown", f"what pid {child.pid} waits on is unknown")),
                         "unknown", command_of(child))
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
                             "pipe-eof", command_of(child))
    if compiling is None:
        inner = follow_child(follow, process, child, others, depth)
        if inner is not None:
            return WaitChain((first, *inner.hops), inner.end, inner.subject)
    if reads:
        target = read.target if read is not None else "an unknown descriptor"
        return WaitChain((first, Hop("process", f"pid {child.pid} is blocked reading fd "
                                                f"{main.first_arg}{stream} ({target})")),
                         waiting_end, command_of(child))
    kernel = main.wchan or main.syscall_name or "an unknown place"
    return WaitChain((first, Hop("process", f"pid {child.pid} waits in the kernel at "
                                            f"{kernel}")), waiting_end, command_of(child))


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


def _thread_name(others: Sequence[Proc], pid: int, tid: int) -> str | None:
    """The name a sampled process gives its thread ``tid`` (None when not sampled)."""
    for other in others:
        if other.sample.pid == pid:
            for thread in other.sample.threads:
                if thread.os_thread_id == tid:
                    return thread.name
    return None


def _follow_exit(waiting: Waiting) -> WaitChain | None:
    """A wait for a child to exit; a thread whose kernel wait was not matched to it (a
    sample without thread ids) but which stands in subprocess's code waits for a child
    too."""
    thread, waits, os_wait = waiting.thread, waiting.process.waits, waiting.os_wait
    in_child_code = any(SUBPROCESS.search(f.file) for f in thread.python_frames()) or \
        _joins_process(thread)
    if in_child_code and (waiting.frame is not None or waiting.writer is not None or
                          os_wait is None and waits is not None and waits.children) or \
            os_wait is not None and (os_wait.syscall_name in ("wait4", "waitid") or
                                     os_wait.wchan in CHILD_WCHAN):
        return _child_chain(waiting.follow, waiting.process, thread, waiting.own,
                            waiting.writer, waiting.others, waiting.depth)
    return None


def _follow_output(waiting: Waiting) -> WaitChain | None:
    """A read of a pipe a child writes, outside subprocess's code (``os.read``, ...)."""
    if waiting.writer is None:
        return None
    return _child_chain(waiting.follow, waiting.process, waiting.thread, waiting.own,
                        waiting.writer, waiting.others, waiting.depth)


def _pipe_eof(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Close the write end before waiting for `{subject}` (`proc.stdin.close()`), "
            f"or use `communicate()` / `subprocess.run(input=...)`, which send end of "
            f"file{said_at(chain, 0)}.")


def _child_waits(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"The child `{subject}` never exits: make what it waits for happen, or wait "
            f"for it with a timeout (`wait(timeout=...)`){said_at(chain, 0)}.")


def _compile_cxx(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"torch.compile{called_at(chain)} waits for `{subject}`, which its C++ build "
            f"runs as the compiler (or a wrapper around it) and which does not exit: run "
            f"that compiler by hand to see why, or point torch.compile at one that works "
            f"(it runs the `CXX` environment variable when set, else `g++`).")


def _compile_child(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"torch.compile{called_at(chain)} waits for `{subject}`, a program it started "
            f"and which does not exit: run it by hand to see why.")


def _pipe_unread(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    if subject == "multiprocessing.Queue":
        joined = JOIN_CALL.search(chain.hops[0].code or "")
        join = f"{joined[1]}.join()" if joined else "p.join()"
        return (f"Read the queue before waiting for the child to exit{said_at(chain, 0)}: "
                f"`q.get()` before `{join}`; what the child put on it fills the pipe, and "
                f"the child cannot exit until that is read.")
    return (f"Read what the child writes into {subject} before waiting for it to exit"
            f"{said_at(chain, 0)} (`communicate()` for a subprocess), or wait with a "
            f"timeout and read in between: the child cannot exit until it is read.")


FAMILY = Family("children", _follow_exit, {
    "pipe-eof": End("a child reads a pipe whose write end the waiting process holds",
                    _pipe_eof),
    "child-waits": End("a child blocked elsewhere", _child_waits),
    "compile-cxx": End("torch.compile waits for the program it runs as its C++ compiler "
                       "(its C++ build, torch/_inductor/cpp_builder.py, is on the stack), "
                       "which does not exit", _compile_cxx),
    "compile-child": End("the same for another program torch.compile started",
                         _compile_child),
    "pipe-unread": End("a child the process waits for is blocked writing into a pipe the "
                       "process holds the read end of and does not read while it waits "
                       "(a multiprocessing.Queue joined before it is read)", _pipe_unread),
})


OUTPUT = Family("a child's output", _follow_output, {})
"""A read of a child's output outside subprocess's code: the same chain as a wait for
the child, asked after the families of waits inside a library (a DataLoader's, a pool's)
whose pipes children also write."""
