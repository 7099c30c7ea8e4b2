"""DataLoader workers: a wait inside the DataLoader.

The worker processes sampled at the stall and the frame each stands at, followed as a
process of its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.verdict.waits.model import (
    End,
    Family,
    Follow,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    continued,
    label,
    main_thread,
    said_at,
    strip_label,
)

DATALOADER = re.compile(r"/torch/utils/data/")


def _worker_chain(follow: Follow, process: Proc, thread: ThreadStack, own: StackFrame | None,
                  others: Sequence[Proc]) -> WaitChain:
    where = f" at {at(own)}" if own is not None else ""
    first = Hop("worker", f"{label(thread)} waits for a batch from the DataLoader{where}",
                at(own) if own else None, own.code if own else None)
    workers = [p for p in others if "DataLoader worker" in p.role]
    if not workers:
        return WaitChain((first, Hop("unknown", "no DataLoader worker was sampled: which one "
                                                "holds it up is unknown")), "unknown")
    worker = workers[0]
    main = main_thread(worker.sample)
    if main is None:
        return WaitChain((first, Hop("unknown", f"where {worker.role} stands is unknown")),
                         "unknown")
    inner = follow(worker, main, ())
    return continued(first, inner, f"{worker.role} (pid {worker.sample.pid}) "
                                   f"{strip_label(inner.hops[0].text, main)}", "worker")


def _follow(waiting: Waiting) -> WaitChain | None:
    if waiting.frame is None or not any(DATALOADER.search(f.file)
                                        for f in waiting.thread.python_frames()):
        return None
    return _worker_chain(waiting.follow, waiting.process, waiting.thread, waiting.own,
                         waiting.others)


def _worker(chain: WaitChain) -> str:
    return (f"The DataLoader worker stands{said_at(chain, -1)} and never returns a batch: "
            f"make that line return (run the dataset with `num_workers=0` to see it "
            f"alone), or set the DataLoader's `timeout`.")


FAMILY = Family("DataLoader workers", _follow, {
    "worker": End("a DataLoader worker stands at its frame", _worker),
})
