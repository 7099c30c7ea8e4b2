"""The families of waits, one module each, in one registry: how a waiting thread is read
(``follow``), the ends its chain has and the advice for each.

``follow_thread(process, thread, others)`` asks the families in ``FAMILIES``' order (their
priority: a lock in the user's line before the library it is in, a wait inside a library
whose pipes children write before a plain read of a child's output) for the chain from
``thread``; the first that answers gives it, and ``unnamed`` always answers. A family that
leads to another thread or process (a join, a pool's worker, a child) continues there
through the same walk. ``advice(chain)`` is the sentence of what to change where the chain
ends, from the family that owns its end.

Adding a family: one module with its ``FAMILY`` (its ``follow`` and its ends with their
advice) and one line in ``FAMILIES``.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsadiag.evidence import ThreadStack
from nsadiag.verdict.waits import (
    barriers,
    children,
    collectives,
    compile_workers,
    dataloader,
    file_locks,
    forked_pools,
    futures,
    joins,
    locks,
    pipes,
    process_pool,
    process_queues,
    queues,
    rendezvous,
    sleeps,
    sockets,
    stopped,
    terminal,
    unnamed,
)
from nsadiag.verdict.waits.model import End, Family, Proc, WaitChain, Waiting

FAMILIES: tuple[Family, ...] = (
    locks.FAMILY,
    rendezvous.FAMILY,
    file_locks.FAMILY,
    children.FAMILY,
    compile_workers.FAMILY,
    dataloader.FAMILY,
    process_pool.FAMILY,
    futures.FAMILY,
    children.OUTPUT,
    pipes.FAMILY,
    terminal.FAMILY,
    sockets.FAMILY,
    barriers.FAMILY,
    process_queues.FAMILY,
    joins.FAMILY,
    queues.FAMILY,
    sleeps.FAMILY,
    forked_pools.FAMILY,
    stopped.FAMILY,
    collectives.FAMILY,
    unnamed.FAMILY,
)
OWNERS: dict[str, Family] = {end: family for family in FAMILIES for end in family.ends}
ENDS: tuple[str, ...] = tuple(OWNERS)
"""Every way a chain ends, each owned by one family (its module says what it means)."""


def follow_thread(process: Proc, thread: ThreadStack, others: Sequence[Proc],
                  depth: int = 0) -> WaitChain:
    """The chain from ``thread`` of ``process``; ``depth`` counts the threads already
    followed to reach it (a join leads to the joined thread)."""
    waiting = Waiting.of(process, thread, others, depth, follow_thread)
    for family in FAMILIES:
        chain = family.follow(waiting) if family.follow is not None else None
        if chain is not None:
            if chain.end not in OWNERS:
                raise ValueError(f"the {family.name} family ended a chain with {chain.end!r}, "
                                 f"an end no family owns")
            return chain
    raise AssertionError("the unnamed family answers every thread")


def end_of(name: str) -> End | None:
    """The end ``name`` (its meaning and advice), None when no family owns it (a record
    written by another version)."""
    family = OWNERS.get(name)
    return family.ends[name] if family is not None else None


def advice(chain: WaitChain) -> str | None:
    """One sentence: what to change where the chain ends; None where its end names no
    cause (or another verdict's sentence says it)."""
    end = end_of(chain.end)
    return end.advice(chain) if end is not None else None


__all__ = ["ENDS", "FAMILIES", "OWNERS", "advice", "end_of", "follow_thread"]
