"""Pipes nobody closes: a read of a pipe whose write end no child holds.

The processes of the machine that hold it (nsadiag.probes.waits scans /proc), and the
child that ended (its exit status from /proc, as its parent will read it) when the read is
a subprocess's output.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.verdict.waits.model import (
    SUBPROCESS,
    End,
    Family,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    label,
    read_file,
    said_at,
    short_command,
)
from nsadiag.waitfacts import OpenFile, PipeWriter


def _held_pipe_chain(process: Proc, thread: ThreadStack, own: StackFrame | None,
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
        return WaitChain((Hop("pipe", f"{label(thread)} waits to read fd {read.fd}, "
                                      f"{read.target}{where}", at(own) if own else None,
                              own.code if own else None),
                          Hop("pipe", f"its write end is open in {holders}: the read never "
                                      f"reaches end of file while it is")), "pipe-held",
                         subject)
    name = f" (`{child.name}`)" if child.name else ""
    return WaitChain((Hop("child", f"{label(thread)} waits to read the output of child pid "
                                   f"{child.pid}{name}{where}", at(own) if own else None,
                          own.code if own else None),
                      Hop("ended", f"pid {child.pid} ended ({child.status()})"),
                      Hop("pipe", f"but the write end of its output ({read.target}) is still "
                                  f"open in {holders}: the read never reaches end of file "
                                  f"while it is")), "pipe-held", subject)


def _follow(waiting: Waiting) -> WaitChain | None:
    waits = waiting.process.waits
    read = read_file(waits, waiting.os_wait) if waiting.writer is None else None
    held = [w for w in waits.pipe_writers if read is not None and read.is_pipe and
            w.inode == read.inode] if waits is not None else []
    if not held:
        return None
    return _held_pipe_chain(waiting.process, waiting.thread, waiting.own, read, held)


def _pipe_held(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"`{subject}` holds the write end of the pipe read{said_at(chain, 0)} open, so "
            f"the read never reaches end of file: start that process with its output "
            f"elsewhere (`stdout=subprocess.DEVNULL`, or `> /dev/null 2>&1` in a shell "
            f"command), or read with a timeout (`communicate(timeout=...)`).")


FAMILY = Family("pipes held open", _follow, {
    "pipe-held": End("a thread reads a pipe whose write end a process other than its "
                     "children holds (the child whose output it is may have ended)",
                     _pipe_held),
})
