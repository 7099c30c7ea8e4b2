"""Leaving a torch.distributed process group without aborting a peer."""

from __future__ import annotations

import itertools
import time

import torch.distributed as dist

_LEAVING = itertools.count()  # one store key per departure of this process


def leave_process_group(finished: bool) -> None:
    """Destroy the default process group, if any. A rank that ``finished`` its work first
    waits for its peers: a barrier, then a count in the rendezvous store. A rank that
    failed does not wait (its peers may never come).

    Why both: tearing gloo down while a peer still uses the connection aborts that peer
    (SIGABRT, "terminate called without an active exception"), and a gloo barrier can
    return on one rank while its last message to a peer is still in flight
    (pytorch/gloo#155). The store is a TCP key-value server, not a gloo connection: once
    every rank has counted itself there, no barrier traffic is left."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if finished:
        dist.barrier()
        leave_together(dist.get_world_size())
    dist.destroy_process_group()


def leave_together(world_size: int, timeout_s: float = 60.0) -> None:
    """Count this rank out in the default store and return once `world_size` ranks have.
    A store that is gone or a peer that never comes (timeout_s) ends the wait: leaving is
    all that is left to do."""
    key = f"nsa/leaving-{next(_LEAVING)}"
    try:
        store = dist.distributed_c10d._get_default_store()
        store.add(key, 1)
        deadline = time.monotonic() + timeout_s
        while store.add(key, 0) < world_size and time.monotonic() < deadline:
            time.sleep(0.005)
    except (RuntimeError, AttributeError, ValueError):
        return
