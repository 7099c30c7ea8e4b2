"""Barriers: ``threading.Barrier.wait`` (and ``multiprocessing.Barrier``, built on it).

A barrier lets its threads through only once all of its parties have called ``wait()``.
The threads (of this process, and for a multiprocessing barrier of every process sampled
at the stall) that wait at the same barrier are counted; every other live thread is where
a missing party stands. None left: the barrier was built for more parties than ever call
``wait()``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import ThreadStack
from nsadiag.probes.frames import user_threads
from nsadiag.verdict.waits.model import (
    QUEUE_CODE,
    THREADING,
    End,
    Family,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    doing,
    label,
    own_frame,
    said_at,
)

PROCESS_BARRIER = re.compile(r"multiprocessing/synchronize\.py$")
RAISED_AT = re.compile(r"\(([^()]+:\d+)\)$")


def _at_barrier(thread: ThreadStack) -> bool:
    """Whether the thread waits inside a ``Barrier.wait`` (py-spy may name the frame
    ``_wait`` without its class: threading.py has no other ``_wait``)."""
    return any(THREADING.search(f.file) and ("Barrier" in f.function or
                                             f.function.rsplit(".", 1)[-1] == "_wait")
               for f in thread.python_frames())


def _barrier_name(thread: ThreadStack) -> str | None:
    own = own_frame(thread)
    called = QUEUE_CODE.search(own.code or "") if own is not None else None
    return called[1] if called and called[2] == "wait" else None


def _parties(process: Proc, others: Sequence[Proc], shared: bool
             ) -> list[tuple[Proc, ThreadStack]]:
    """Every live thread that could be a party: this process's, and for a barrier shared
    by processes the sampled processes' too."""
    processes = [process, *others] if shared else [process]
    return [(p, t) for p in processes for t in user_threads(p.sample)]


def _who(process: Proc, owner: Proc, thread: ThreadStack) -> str:
    frame = own_frame(thread)
    where = f" at {at(frame)}" if frame is not None else ""
    name = label(thread).removeprefix("the ")
    return (name if owner is process else f"{name} of pid {owner.sample.pid}") + where


def _raised_at(where: str) -> str | None:
    """"t.py:13" of an exception record's "load (t.py:13)"."""
    found = RAISED_AT.search(where)
    return found[1] if found else None


def _follow(waiting: Waiting) -> WaitChain | None:
    thread = waiting.thread
    if waiting.frame is None or not _at_barrier(thread):
        return None
    name = _barrier_name(thread) or "the barrier"
    own = waiting.own
    first = Hop("barrier", f"{label(thread)} waits at the barrier `{name}`" +
                (f" at {at(own)}" if own is not None else ""),
                at(own) if own is not None else None, own.code if own is not None else None)
    shared = any(PROCESS_BARRIER.search(f.file) for f in thread.python_frames())
    parties = _parties(waiting.process, waiting.others, shared)
    arrived = [(p, t) for p, t in parties if _at_barrier(t) and _barrier_name(t) in
               (name, None)]
    came = {id(t) for _, t in arrived}
    elsewhere = [(p, t) for p, t in parties if id(t) not in came]
    there = "; ".join(_who(waiting.process, p, t) for p, t in arrived)
    scope = "thread or sampled process" if shared else "thread of the process"
    count = f"{len(arrived)} thread{'s' if len(arrived) != 1 else ''}"
    if not elsewhere and waiting.process.died:
        record = waiting.process.died[-1]
        where = f" at {record['where']}" if record.get("where") else ""
        return WaitChain((first, Hop("barrier", f"{count} wait at `{name}` ({there}) and no "
                                                f"other live {scope} is left to arrive"),
                          Hop("producer", f"thread {record.get('thread') or '?'} died of "
                                          f"{record.get('type')}: {record.get('message')}"
                                          f"{where}, a party that never arrives",
                              _raised_at(str(record.get("where") or "")))),
                         "barrier-party-died", name)
    if not elsewhere:
        return WaitChain((first, Hop("barrier", f"{count} wait at `{name}` ({there}) and no "
                                                f"other live {scope} is left to arrive: the "
                                                f"barrier was built for more parties than "
                                                f"call `wait()`")), "barrier-short", name)
    steps = [doing(t, p) for p, t in elsewhere]
    return WaitChain((first, Hop("barrier", f"{count} wait at `{name}` ({there}); the "
                                            f"other live threads, one of which must arrive: "
                                            + "; ".join(step.text for step in steps),
                                 steps[0].where, steps[0].code)),
                     "barrier-missing", name)


def _barrier_short(chain: WaitChain) -> str:
    wait = said_at(chain, 0).replace(" at ", " (the wait at ", 1) + ")" \
        if said_at(chain, 0) else ""
    return (f"Every live thread waits at `{chain.subject}`{wait} and none is left to "
            f"arrive: its party count is larger than the threads that call `wait()` (a "
            f"count taken before the list it counts was filtered, or a thread that ended "
            f"early). Build it for the threads you really start, and pass "
            f"`wait(timeout=...)` so that a missing party raises `BrokenBarrierError` "
            f"instead of hanging.")


def _barrier_party_died(chain: WaitChain) -> str:
    return (f"Fix the exception that ended the thread the chain names{said_at(chain, -1)}, "
            f"a party of `{chain.subject}` that never arrives, and have such a thread call "
            f"`{chain.subject}.abort()` in a `finally` so that the others raise "
            f"`BrokenBarrierError` instead of waiting{said_at(chain, 0)} (or pass "
            f"`wait(timeout=...)`).")


def _barrier_missing(chain: WaitChain) -> str:
    return (f"Make the thread that never reaches `{chain.subject}` arrive, or call "
            f"`{chain.subject}.abort()` on the path where it leaves (the other live threads "
            f"stand where the chain's last hop shows{said_at(chain, -1)}); pass "
            f"`wait(timeout=...)` so that a missing party raises `BrokenBarrierError` "
            f"instead of hanging{said_at(chain, 0)}.")


FAMILY = Family("barriers", _follow, {
    "barrier-short": End("every live thread waits at a barrier and none is left to "
                         "arrive: it was built for more parties than call wait()",
                         _barrier_short),
    "barrier-party-died": End("the same, and a thread of the process died of an "
                              "exception: a party that never arrives", _barrier_party_died),
    "barrier-missing": End("threads wait at a barrier while other live threads stand "
                           "elsewhere, one of which is the missing party", _barrier_missing),
})
