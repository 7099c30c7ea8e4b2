"""CUDA memory history: record it around some steps, save `snapshot.pickle` (opens in
https://pytorch.org/memory_viz), and summarise it without a browser.

The snapshot is the dict `torch.cuda.memory._snapshot()` returns:

    segments       list of {address, total_size, allocated_size, segment_type, blocks}
                   where each block is {address, size, state, frames}; state is
                   "active_allocated", "active_pending_free" or "inactive" (free)
    device_traces  one list per device of {action, addr, size, frames, time_us}; action is
                   "alloc", "free_requested", "free_completed", "segment_alloc",
                   "segment_free", "segment_map", "segment_unmap", "snapshot" or "oom"
    frames         [{filename, line, name}], innermost first

`summarize_snapshot` is a pure function of that dict:

- live at the peak: the trace is replayed (alloc adds a block, free_completed removes it;
  a block waiting for its stream after free_requested still holds memory). Blocks
  allocated before recording began count from the start: a free of an address never
  allocated in the trace, and every allocated block of the segments that the trace never
  mentions. The peak is the largest live total; its blocks are grouped by allocation
  site: the innermost project frame (a .py file outside site-packages and the standard
  library), else the innermost frame.
- the segment picture: reserved and allocated bytes per segment, the free blocks, the
  largest free block and the fragmentation (reserved - allocated) / reserved.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nsadiag.probes.frames import LIBRARY_PATH

NOT_AVAILABLE = "memory history: not available on this device ({device})"
ALLOCATED = ("active_allocated", "active_pending_free")


def is_project_frame(frame: dict[str, Any]) -> bool:
    """A Python source frame outside installed packages and the standard library."""
    filename = str(frame.get("filename") or "")
    return filename.endswith(".py") and not LIBRARY_PATH.search(filename)


def allocation_site(frames: list[dict[str, Any]] | None,
                    is_project: Callable[[dict[str, Any]], bool] = is_project_frame) -> str:
    """`name (file:line)` of the innermost project frame, else of the innermost frame;
    None stands for a block allocated before recording began (its site is unknowable)."""
    if frames is None:
        return "<allocated before recording began>"
    if not frames:
        return "<no Python frames: native code or the autograd engine>"
    frame = next((f for f in frames if is_project(f)), frames[0])
    name = Path(str(frame.get("filename") or "?")).name
    return f"{frame.get('name', '?')} ({name}:{frame.get('line', 0)})"


def _traces(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The trace entries of every device, in order (one flat list accepted too)."""
    traces = snapshot.get("device_traces") or []
    if traces and isinstance(traces[0], dict):
        return list(traces)
    return [entry for device in traces for entry in device]


def live_at_peak(snapshot: dict[str, Any]) -> tuple[int, dict[int, tuple[int, list]]]:
    """(peak live bytes, {address: (size, frames)} of the blocks live at that peak)."""
    trace = _traces(snapshot)
    live: dict[int, tuple[int, list]] = {}
    seen: set[int] = set()
    for entry in trace:  # blocks that existed before the trace began
        addr = entry.get("addr")
        if entry.get("action") not in ("alloc", "free_requested", "free_completed"):
            continue
        if addr not in seen and entry["action"] != "alloc":
            live[addr] = (int(entry.get("size", 0)), None)
        seen.add(addr)
    for segment in snapshot.get("segments") or []:
        for block in segment.get("blocks") or []:
            if block.get("state") in ALLOCATED and block.get("address") not in seen:
                # frames survive for blocks whose alloc fell out of a full trace buffer
                live[block["address"]] = (int(block["size"]), block.get("frames") or None)
    total = sum(size for size, _ in live.values())
    peak, at_peak = total, dict(live)
    for entry in trace:
        action, addr = entry.get("action"), entry.get("addr")
        if action == "alloc":
            live[addr] = (int(entry.get("size", 0)), entry.get("frames") or [])
            total += live[addr][0]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action == "free_completed" and addr in live:
            total -= live.pop(addr)[0]
    return peak, at_peak


def top_sites(blocks: dict[int, tuple[int, list]], count: int = 10,
              is_project: Callable[[dict[str, Any]], bool] = is_project_frame
              ) -> list[dict[str, Any]]:
    """Live blocks grouped by allocation site, largest total first."""
    sites: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, frames in blocks.values():
        site = sites[allocation_site(frames, is_project)]
        site[0] += size
        site[1] += 1
    ranked = sorted(sites.items(), key=lambda item: (-item[1][0], item[0]))
    return [{"site": site, "bytes": total, "blocks": n} for site, (total, n) in ranked[:count]]


def segment_picture(snapshot: dict[str, Any], count: int = 10) -> dict[str, Any]:
    """Reserved, allocated and free bytes of the segments, the largest free block, the
    fragmentation, and the `count` largest segments with their own numbers."""
    rows = []
    for segment in snapshot.get("segments") or []:
        blocks = segment.get("blocks") or []
        free = [int(b["size"]) for b in blocks if b.get("state") == "inactive"]
        allocated = sum(int(b["size"]) for b in blocks if b.get("state") in ALLOCATED)
        rows.append({"address": segment.get("address"),
                     "type": segment.get("segment_type", "?"),
                     "reserved": int(segment.get("total_size", 0)), "allocated": allocated,
                     "free_blocks": len(free), "largest_free": max(free, default=0)})
    reserved = sum(r["reserved"] for r in rows)
    allocated = sum(r["allocated"] for r in rows)
    rows.sort(key=lambda r: -r["reserved"])
    return {"segments": len(rows), "reserved": reserved, "allocated": allocated,
            "free": reserved - allocated,
            "free_blocks": sum(r["free_blocks"] for r in rows),
            "largest_free_block": max((r["largest_free"] for r in rows), default=0),
            "fragmentation": (reserved - allocated) / reserved if reserved else 0.0,
            "largest_segments": rows[:count]}


def summarize_snapshot(snapshot: dict[str, Any], count: int = 10) -> dict[str, Any]:
    """The headless summary: peak live bytes, top sites at the peak, segment picture."""
    peak, blocks = live_at_peak(snapshot)
    return {"peak_live": peak, "peak_blocks": len(blocks),
            "trace_entries": len(_traces(snapshot)),
            "top_sites": top_sites(blocks, count), **segment_picture(snapshot, count)}


@contextmanager
def memory_history(device: Any, out_dir: Path, write: Callable[[Path, bytes], Path],
                   max_entries: int = 200_000) -> Iterator[dict[str, Any]]:
    """Record CUDA memory history inside the block; afterwards the yielded dict holds
    `snapshot` (path of snapshot.pickle) and `summary`, or `unavailable` (one line) off
    CUDA. Recording is stopped on every way out. ``write(path, data)`` stores the pickle:
    the caller's run-directory writer (nsadiag.rundir.write_bytes), which the probes,
    below the run directory, do not import."""
    import torch

    found: dict[str, Any] = {}
    if device.type != "cuda" or not torch.cuda.is_available():
        found["unavailable"] = NOT_AVAILABLE.format(device=device.type)
        yield found
        return
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        yield found
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    path = write(Path(out_dir) / "snapshot.pickle", pickle.dumps(snapshot))
    found["snapshot"] = str(path)
    found["summary"] = summarize_snapshot(snapshot)
