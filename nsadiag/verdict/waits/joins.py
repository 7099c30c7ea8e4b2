"""Threads joined: ``Thread.join``.

The process's one other live thread of the user's, followed as the chain of its own (which
of several is the one joined is not in the evidence). Its chain ends where the joined
thread's ends: this family has no end of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.probes.frames import user_threads
from nsadiag.verdict.waits.model import (
    MAX_DEPTH,
    QUEUE_CODE,
    THREADING,
    Family,
    Follow,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    doing,
    label,
)


def _joins_thread(thread: ThreadStack) -> bool:
    """Whether the thread waits in ``Thread.join`` (threading.py), not a queue's join."""
    return any(THREADING.search(f.file) and f.function.rsplit(".", 1)[-1] in
               ("join", "_wait_for_tstate_lock") for f in thread.python_frames())


def _join_chain(follow: Follow, process: Proc, thread: ThreadStack, own: StackFrame, name: str,
                others: Sequence[Proc], depth: int) -> WaitChain:
    """A ``Thread.join``: the thread joined, when the process has one other live thread of
    the user's (which of several is ``name`` is not in the evidence), followed."""
    first = Hop("join", f"{label(thread)} waits for thread `{name}` to finish at {at(own)}",
                at(own), own.code)
    candidates = [t for t in user_threads(process.sample) if t is not thread]
    if len(candidates) != 1:
        alive = "; ".join(doing(t, process).text for t in candidates) or "none"
        return WaitChain((first, Hop("unknown", f"which live thread is `{name}` is unknown; "
                                                f"the other live threads: {alive}")),
                         "unknown", name)
    joined = candidates[0]
    if depth >= MAX_DEPTH:
        return WaitChain((first, doing(joined, process)), "unknown", name)
    inner = follow(process, joined, others, depth + 1)
    return WaitChain((first, *inner.hops), inner.end, inner.subject)


def _follow(waiting: Waiting) -> WaitChain | None:
    own = waiting.own
    queued = QUEUE_CODE.search(own.code or "") if own is not None else None
    if not queued or waiting.frame is None or queued[2] != "join" or \
            not _joins_thread(waiting.thread):
        return None
    return _join_chain(waiting.follow, waiting.process, waiting.thread, own, queued[1],
                       waiting.others, waiting.depth)


FAMILY = Family("threads joined", _follow, {})
