"""Locks and conditions: ``with X:`` / ``X.acquire()``.

The thread of the same process inside a ``with X:`` block (nsadiag.probes.scopes, read at
the stall) holds it (the waiting thread itself, in an outer frame: a lock taken twice);
that thread's own wait is the next hop (a cycle when it waits for a lock the first one
holds; a full queue when it waits in ``put``). No live thread inside such a block: in a
process forked from another (a DataLoader worker, a child forked without an exec) the
holder was a thread that did not survive the fork; otherwise no holder is known.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.probes.frames import user_threads, wait_frame
from nsadiag.verdict.waits.model import (
    QUEUE_CODE,
    End,
    Family,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    at_scope,
    doing,
    label,
    own_frame,
    said_at,
)
from nsadiag.waitfacts import Scope

LOCK_CODE = re.compile(r"^\s*(?:async\s+)?with\s+([\w.\[\]'\"]+)\s*(?:as\s+\w+\s*)?:|"
                       r"([\w.\[\]]+)\.acquire\(")


def _lock_name(code: str | None) -> str | None:
    match = LOCK_CODE.search(code or "")
    return (match[1] or match[2]) if match else None


def _holds(scopes: Sequence[Scope], thread: ThreadStack, lock: str) -> Scope | None:
    """The scope of ``thread`` inside a ``with lock:`` block, None when none is."""
    return next((scope for scope in scopes if scope.thread_id == thread.thread_id and
                 any(text == lock for text, _ in scope.withs)), None)


def _lock_chain(process: Proc, thread: ThreadStack, frame: StackFrame, lock: str
                ) -> WaitChain:
    scopes = process.waits.scopes if process.waits else ()
    first = Hop("lock", f"{label(thread)} waits for `{lock}` at {at(frame)}", at(frame),
                frame.code)
    itself = _holds(scopes, thread, lock)
    if itself is not None:
        line = next(n for text, n in itself.withs if text == lock)
        return WaitChain((first, Hop("holder", f"`{lock}` is held by the same thread, in "
                                               f"{itself.function} (inside `with {lock}:` at "
                                               f"{at_scope(itself.file, line)}): a lock that "
                                               f"is not reentrant, taken twice",
                                     at_scope(itself.file, line))), "lock-self", lock)
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
    second = Hop("holder", f"`{lock}` is held by {label(holder)} (inside `with {lock}:` at "
                           f"{at_scope(scope.file, line)})", at_scope(scope.file, line))
    held_frame = wait_frame(holder)
    own = own_frame(holder)
    other_lock = _lock_name(own.code) if own is not None and held_frame is not None else None
    mine = _holds(scopes, thread, other_lock) if other_lock is not None else None
    if mine is not None:
        inside = at_scope(mine.file, next(n for text, n in mine.withs if text == other_lock))
        return WaitChain((first, second, Hop(
            "lock", f"{label(holder)} waits for `{other_lock}` at {at(own)}, which "
                    f"{label(thread)} holds (inside `with {other_lock}:` at {inside}): each "
                    f"waits for the other", at(own), own.code)),
            "lock-cycle", f"{lock}` and `{other_lock}")
    queued = QUEUE_CODE.search(own.code or "") if own is not None else None
    if held_frame is not None and own is not None and queued and queued[2] == "put":
        return WaitChain((first, second, Hop(
            "queue", f"{label(holder)} waits in `{queued[1]}.put` at {at(own)} (the queue "
                     f"is full) while it holds `{lock}`", at(own), own.code)),
            "queue-full", lock)
    return WaitChain((first, second, doing(holder, process)), "lock-held", lock)


def _follow(waiting: Waiting) -> WaitChain | None:
    lock = _lock_name(waiting.own.code) if waiting.own is not None else None
    if lock is None or waiting.frame is None:
        return None
    return _lock_chain(waiting.process, waiting.thread, waiting.own, lock)


def _where_lock(chain: WaitChain) -> str:
    """" at file:line" of the chain's last wait for a lock ("" when it has none)."""
    index = next((i for i in range(len(chain.hops) - 1, -1, -1)
                  if chain.hops[i].kind == "lock"), len(chain.hops))
    return said_at(chain, index)


def _lock_cycle(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Take the locks `{subject}` in the same order in every thread (or hold one "
            f"at a time): each of the two threads holds one and waits for the other"
            f"{said_at(chain, 0)}{said_at(chain, -1).replace(' at ', ' and ')}.")


def _lock_self(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Do not take the lock `{subject}` again while the same thread holds it"
            f"{said_at(chain, -1)}: release it before the call that leads to the wait"
            f"{said_at(chain, 0)}, or make it a `threading.RLock`.")


def _queue_full(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Do not hold the lock `{subject}` across a blocking `put`"
            f"{said_at(chain, -1)}: put the item after releasing it (or "
            f"`put(timeout=...)`), since the thread that empties the queue first waits "
            f"for `{subject}`{said_at(chain, 0)}.")


def _lock_held(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"The lock `{subject}` stays held while its holder does what the chain's last hop "
            f"shows{said_at(chain, -1)}: release it before that, or do not wait for it"
            f"{said_at(chain, 0)}.")


def _lock_lost(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Release the lock `{subject}` on every path (a `with` block, or "
            f"`try`/`finally`): it is locked, and no live thread is inside a `with` "
            f"block for it, so an acquire without its release (or a thread that "
            f"has ended) holds it{said_at(chain, 0)}.")


def _lock_lost_fork(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    if any("DataLoader worker" in h.text for h in chain.hops):
        return (f"Do not fork while a thread holds `{subject}`: start the DataLoader workers "
                f"with `multiprocessing_context=\"spawn\"` (or \"forkserver\"), or create the "
                f"lock in each worker (`worker_init_fn`).")
    # acquiring before the fork and releasing on both sides is how the standard
    # library keeps its own locks (logging's) consistent across os.fork()
    return (f"Do not fork while another thread may hold `{subject}`: start the child "
            f"with the spawn start method (`multiprocessing.get_context(\"spawn\")`), or "
            f"take the lock around every fork (`os.register_at_fork(before={subject}"
            f".acquire, after_in_parent={subject}.release, after_in_child={subject}"
            f".release)`); the child waits for it{_where_lock(chain)}.")


FAMILY = Family("locks", _follow, {
    "lock-cycle": End("two threads each hold the lock the other waits for", _lock_cycle),
    "lock-self": End("the waiting thread holds it itself, in an outer frame", _lock_self),
    "lock-held": End("the holder is found and waits or works elsewhere", _lock_held),
    "lock-lost": End("no live thread holds it", _lock_lost),
    "lock-lost-fork": End("the same in a forked process (the holder did not survive the "
                          "fork)", _lock_lost_fork),
    "queue-full": End("the holder waits in Queue.put", _queue_full),
})
