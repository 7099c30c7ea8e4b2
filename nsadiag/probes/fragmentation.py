"""Fragmentation at a CUDA out-of-memory error: how much of the reserved memory was free
but in pieces too small for what was asked (pytorch#29554).

At an OOM the caching allocator holds segments reserved from the driver, each split into
blocks that are allocated or free. ``from_segments(segments, requested)`` sums them from
``torch.cuda.memory_snapshot()``'s segments (each ``total_size`` and ``blocks`` of
``size`` and ``state``): reserved, allocated, free inside the reserved segments and the
largest free block; "fragmented" when the free blocks add up to what was asked
(``requested``, read from the error's "Tried to allocate 2.00 GiB") while none of them
alone is that large. ``at_oom(exc)`` takes the snapshot in the failing process, right where
the exception is recorded; off CUDA (or before CUDA was used) it says in one line that
this is not available. Nothing here imports torch: a process that never loaded it is told
so.
"""

from __future__ import annotations

import re
import sys
from typing import Any

REQUESTED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) ?(B|KiB|MiB|GiB|TiB)")
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
NOT_AVAILABLE = "fragmentation at the OOM: not available on this device ({why})"


def requested_bytes(message: str) -> int | None:
    """The bytes an OOM message says were asked for, None when it does not say."""
    match = REQUESTED.search(message)
    return int(float(match[1]) * UNITS[match[2]]) if match else None


def from_segments(segments: list[dict[str, Any]], requested: int | None) -> dict[str, Any]:
    """The allocator's reserved, allocated and free bytes, its largest free block and
    whether the request failed for fragmentation (see the module docstring)."""
    reserved = allocated = free = largest = 0
    for segment in segments:
        reserved += int(segment.get("total_size", 0))
        for block in segment.get("blocks", []):
            size, state = int(block.get("size", 0)), block.get("state")
            if state == "active_allocated":
                allocated += size
            elif state == "inactive":
                free += size
                largest = max(largest, size)
    return {"reserved": reserved, "allocated": allocated, "free_in_reserved": free,
            "largest_free_block": largest, "requested": requested,
            "fragmented": requested is not None and free >= requested > largest}


def at_oom(exc: BaseException) -> dict[str, Any]:
    """The fragmentation of the CUDA allocator now, for ``exc`` (an OOM); {"unavailable":
    one line} when there is no CUDA allocator in use in this process."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"unavailable": NOT_AVAILABLE.format(why="torch was not loaded")}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {"unavailable": NOT_AVAILABLE.format(why="CUDA was not in use")}
        segments = torch.cuda.memory_snapshot()
    except Exception as err:  # noqa: BLE001 - the user's OOM is what matters here
        return {"unavailable": NOT_AVAILABLE.format(why=f"no snapshot: {err}"[:200])}
    return from_segments(segments, requested_bytes(str(exc)))
