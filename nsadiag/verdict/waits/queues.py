"""Queues, events and conditions: ``Queue.get``/``Event.wait``/``Condition.wait``.

A thread that died of an exception (nsadiag.harness.thread_exceptions) is the producer
that is gone; else the other live threads, none of which is known to feed it.
"""

from __future__ import annotations

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.probes.frames import user_threads
from nsadiag.verdict.waits.model import (
    QUEUE_CODE,
    End,
    Family,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    doing,
    label,
    said_at,
)


def _queue_chain(process: Proc, thread: ThreadStack, own: StackFrame, name: str,
                 method: str) -> WaitChain:
    what = {"get": f"an item from `{name}`", "wait": f"`{name}` to be set or notified",
            "join": f"`{name}` to finish", "put": f"room in `{name}`"}[method]
    first = Hop("queue", f"{label(thread)} waits for {what} at {at(own)}", at(own), own.code)
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
                                                 doing(t, process).text for t in others))),
                     "no-producer", name)


def _follow(waiting: Waiting) -> WaitChain | None:
    own = waiting.own
    queued = QUEUE_CODE.search(own.code or "") if own is not None else None
    if not queued or waiting.frame is None:
        return None
    return _queue_chain(waiting.process, waiting.thread, own, queued[1], queued[2])


def _where_queue(chain: WaitChain) -> str:
    """" at file:line" of the chain's wait on a queue (after a join that led to it, the
    joined thread's wait), the first hop's where it has none."""
    index = next((i for i, hop in enumerate(chain.hops) if hop.kind == "queue"), 0)
    return said_at(chain, index)


def _producer_died(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Fix the exception that ended the thread feeding `{subject}` (the chain names "
            f"it), and have that thread put a sentinel in a `finally` so the wait"
            f"{_where_queue(chain)} ends when it dies (or `get(timeout=...)`).")


def _no_producer(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Make sure a thread feeds `{subject}` and puts a sentinel when it ends, or "
            f"wait with a timeout{_where_queue(chain)}: no thread is known to feed it.")


FAMILY = Family("queues", _follow, {
    "producer-died": End("the thread that fed a queue died", _producer_died),
    "no-producer": End("no thread is known to feed it", _no_producer),
})
