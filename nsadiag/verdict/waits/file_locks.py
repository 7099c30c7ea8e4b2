"""File locks: ``flock``/``fcntl`` in the kernel.

The pid that holds a lock on the same file (/proc/locks) and where it stands when it was
sampled.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.verdict.waits.model import (
    End,
    Family,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    command_of,
    doing,
    label,
    main_thread,
    said_at,
)

FILE_LOCK_WCHAN = re.compile(r"lock_inode_wait|flock|posix_lock|locks_")


def _file_lock_chain(process: Proc, thread: ThreadStack, own: StackFrame | None,
                     others: Sequence[Proc]) -> WaitChain | None:
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
    first = Hop("file-lock", f"{label(thread)} waits for the {lock.kind.lower()} lock on "
                             f"{lock.path}{where}", at(own) if own else None,
                own.code if own else None)
    holder = next((p for p in others if p.sample.pid == lock.pid), None)
    command = f" (`{command_of(holder.waits)}`)" if holder and holder.waits and \
        holder.waits.command else ""
    second = Hop("holder", f"it is held ({lock.access.lower()}) by pid {lock.pid}{command}, "
                           f"by /proc/locks")
    if holder is None:
        return WaitChain((first, second, Hop("unknown", f"what pid {lock.pid} is doing is "
                                                        f"unknown (it was not sampled)")),
                         "file-lock", lock.path)
    main = main_thread(holder.sample)
    if main is None:
        return WaitChain((first, second, Hop("unknown", f"where pid {lock.pid} stands is "
                                                        f"unknown")), "file-lock", lock.path)
    step = doing(main, holder)
    return WaitChain((first, second, Hop(step.kind, f"pid {lock.pid}: {step.text}",
                                         step.where, step.code)), "file-lock", lock.path)


def _follow(waiting: Waiting) -> WaitChain | None:
    os_wait = waiting.os_wait
    if os_wait is None or not (os_wait.syscall_name == "flock" or
                               FILE_LOCK_WCHAN.search(os_wait.wchan or "")):
        return None
    return _file_lock_chain(waiting.process, waiting.thread, waiting.own, waiting.others)


def _file_lock(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"The process holding the file lock on {subject} waits while it holds it"
            f"{said_at(chain, -1)}: release the lock before that wait, or take it here "
            f"with `LOCK_NB` and a retry deadline{said_at(chain, 0)}.")


FAMILY = Family("file locks", _follow, {
    "file-lock": End("another process holds a file lock", _file_lock),
})
