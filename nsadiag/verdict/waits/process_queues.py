"""Queues between processes: a ``multiprocessing.Queue.get`` (a ``SimpleQueue``'s too).

What is put on such a queue comes from another process, not from a thread of this one:
the child of this process that would put on it, when one was sampled at the stall, is
followed into its own threads; several children are each said where they stand; no child
alive, with one that ended, means the producer is gone (its exit status from /proc, as its
parent will read it); no child at all leaves the producer unknown (a sibling's queue), never
a thread of this process that should feed it.
"""

from __future__ import annotations

import re

from nsadiag.evidence import ThreadStack
from nsadiag.verdict.waits.model import (
    QUEUE_CODE,
    End,
    Family,
    Hop,
    WaitChain,
    Waiting,
    at,
    command_of,
    label,
    said_at,
)
from nsadiag.verdict.waits.processes import follow_child

MP_QUEUE_FILE = re.compile(r"multiprocessing/queues\.py$")
MP_HELPER = re.compile(r"multiprocessing\.(?:resource_tracker|forkserver)\b")
"""multiprocessing's own helper processes (started with spawn and forkserver): they put
nothing on a user's queue."""


def _gets_from_process_queue(thread: ThreadStack) -> bool:
    return any(MP_QUEUE_FILE.search(f.file) and f.function.rsplit(".", 1)[-1] == "get"
               for f in thread.python_frames())


def _follow(waiting: Waiting) -> WaitChain | None:
    thread, own, waits = waiting.thread, waiting.own, waiting.process.waits
    if waiting.frame is None and waiting.os_wait is None or waits is None or \
            not _gets_from_process_queue(thread):
        return None
    called = QUEUE_CODE.search(own.code or "") if own is not None else None
    name = called[1] if called else "the queue"
    first = Hop("queue", f"{label(thread)} waits for an item from the multiprocessing queue "
                         f"`{name}`" + (f" at {at(own)}" if own is not None else ""),
                at(own) if own is not None else None, own.code if own is not None else None)
    children = [c for c in waits.children
                if not any(MP_HELPER.search(arg) for arg in c.command)]
    if not children and not waits.ended:
        return WaitChain((first, Hop("unknown", "no child of this process is alive to put on "
                                                "it, and none was seen to end: which process "
                                                "should put on it is unknown")), "unknown",
                         name)
    if not children:
        gone = "; ".join(f"pid {e.pid}{f' (`{e.name}`)' if e.name else ''} ended "
                         f"({e.status()})" for e in waits.ended)
        return WaitChain((first, Hop("ended", f"no child of this process is alive to put on "
                                              f"it: {gone}")),
                         "queue-producer-ended",
                         ", ".join(f"pid {e.pid}" for e in waits.ended))
    if len(children) == 1:
        inner = follow_child(waiting.follow, waiting.process, children[0], waiting.others,
                             waiting.depth)
        if inner is not None:
            return WaitChain((first, *inner.hops), inner.end, inner.subject)
    stands = "; ".join(
        f"pid {c.pid} (`{command_of(c)}`) waits in the kernel at "
        f"{(main.wchan or main.syscall_name) if main else 'an unknown place'}"
        for c in children for main in [c.thread(c.pid)])
    return WaitChain((first, Hop("process", f"the children that could put on it: {stands} "
                                            f"(none was sampled at a line of its own)")),
                     "process-queue", name)


def _producer_ended(chain: WaitChain) -> str:
    return (f"Find why {chain.subject} ended before it put its result (its exit status is "
            f"in the chain: a signal is a crash or a kill, a code an `exit` or an uncaught "
            f"exception in the child), and do not wait on the queue for a process that is "
            f"gone: `q.get(timeout=...)` in a loop that checks `p.exitcode`{said_at(chain, 0)}.")


def _process_queue(chain: WaitChain) -> str:
    return (f"The children that should put on `{chain.subject}` never do: run the child's "
            f"target once in the main process to see where it stops, and wait with "
            f"`q.get(timeout=...)` in a loop that checks `p.exitcode`{said_at(chain, 0)}.")


FAMILY = Family("queues between processes", _follow, {
    "queue-producer-ended": End("a multiprocessing queue is read while no child of the "
                                "process is alive to put on it, and one ended",
                                _producer_ended),
    "process-queue": End("a multiprocessing queue is read while the children that could "
                         "put on it wait elsewhere, none at a line of its own",
                         _process_queue),
})
