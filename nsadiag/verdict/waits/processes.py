"""Following a wait into another process of the job: a child sampled at the stall (a
Python process of the job) is followed into its own threads through the registry's walk,
each of its hops naming it; a child forked without an exec is a copy of its parent (a lock
no thread of it holds was locked by a thread that was not copied; a thread pool of the
parent's is not in it)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import StackSample
from nsadiag.verdict.waits.model import (
    MAX_DEPTH,
    Follow,
    Proc,
    WaitChain,
    continued,
    own_frame,
    start_thread,
)
from nsadiag.waitfacts import ProcessWaits

POPEN_FORK = re.compile(r"multiprocessing/popen_fork\.py$")
"""The fork start method's handle: a forked child's stack keeps its ``Popen._launch``."""
FORK_CALL = re.compile(r"\bos\.fork\(\)")


def forked_copy(child: ProcessWaits, parent: Proc, sample: StackSample) -> bool:
    """Whether ``child`` is a copy of the parent made by fork without an exec: its stack
    holds the call that forked it (multiprocessing's fork start method, or ``os.fork()`` in
    the user's code, both copied from the parent), or it runs the parent's very command."""
    if parent.waits is not None and child.command and child.command == parent.waits.command:
        return True
    return any(POPEN_FORK.search(f.file) and f.function.endswith("_launch") or
               FORK_CALL.search(f.code or "") for t in sample.threads for f in t.frames)


def follow_child(follow: Follow, process: Proc, child: ProcessWaits, others: Sequence[Proc],
                 depth: int) -> WaitChain | None:
    """The chain of a child the waiting thread waits for, followed into the child's own
    threads when the child was sampled at the stall (a Python process of the job): its
    hops, each naming the child; None when it was not sampled or names no line of its
    own. A child forked without an exec is a copy of this process, and a lock no thread
    of it holds was locked by a thread that was not copied."""
    sampled = next((o for o in others if o.sample.pid == child.pid), None)
    if sampled is None or depth >= MAX_DEPTH:
        return None
    start = start_thread(sampled.sample)
    if start is None:
        return None
    forked = sampled.forked or forked_copy(child, process, sampled.sample)
    copy = Proc(sampled.sample, sampled.waits or child, sampled.died,
                    f"pid {child.pid}" + (", a forked copy of this process" if forked and
                                          not sampled.forked else ""), forked)
    inner = follow(copy, start, [o for o in others if o is not sampled], depth + 1)
    if inner.end == "unknown" and own_frame(start) is None:  # no line of the user's to name
        return None
    copied = " (forked from this process, no exec)" if forked else ""
    return continued(None, inner, f"in pid {child.pid}{copied}, {inner.hops[0].text}")
