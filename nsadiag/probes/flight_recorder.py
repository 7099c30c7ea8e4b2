"""NCCL Flight Recorder: the ring buffer of recent collectives ProcessGroupNCCL keeps per
rank, dumped into the trial directory.

Two ways a dump gets there, both into <trial_dir>/flight-recorder/:
* on a process-group timeout, by NCCL itself: `child_env` sets TORCH_NCCL_TRACE_BUFFER_SIZE
  (entries kept), TORCH_NCCL_DUMP_ON_TIMEOUT=1 and TORCH_NCCL_DEBUG_INFO_TEMP_FILE (the
  file prefix; NCCL appends the rank) for the launched job only;
* on a stall the runner detects first, on request: each NCCL rank runs `DumpOnRequest`, a
  daemon thread that waits for <rank_dir>/dump-request and then writes
  `_dump_fr_trace_json()` to rank-<r>.json. A Python thread can do that while the main
  thread is blocked, because a blocked NCCL wait or autograd backward releases the GIL.

`summarize_dump` (pure) reads one dump's dict: per entry collective_seq_id,
profiling_name (e.g. "nccl:all_reduce"), state ("scheduled" | "started" | "completed"),
input_sizes and the process group.
"""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path
from typing import Any

DIR_NAME = "flight-recorder"
TRACE_BUFFER_ENTRIES = 2000
REQUEST_NAME = "dump-request"
KEEP_ENTRIES = 8


def child_env(trial_dir: Path) -> dict[str, str]:
    """Environment variables that arm the Flight Recorder and point its dumps here."""
    folder = trial_dir / DIR_NAME
    folder.mkdir(parents=True, exist_ok=True)
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(TRACE_BUFFER_ENTRIES),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(folder / "nccl_trace_rank_")}


def request_dumps(rank_dirs: list[Path]) -> None:
    """Ask every rank's DumpOnRequest thread for a dump (a rank that has not started yet
    has no directory and nothing to dump)."""
    for rank_dir in rank_dirs:
        if rank_dir.is_dir():
            (rank_dir / REQUEST_NAME).write_text("")


class DumpOnRequest(threading.Thread):
    """Rank side: when <rank_dir>/dump-request appears, dump the Flight Recorder as JSON to
    <trial_dir>/flight-recorder/rank-<rank>.json (once)."""

    def __init__(self, rank_dir: Path, trial_dir: Path, rank: int, poll_s: float = 0.2):
        super().__init__(name="nsadiag-flight-recorder", daemon=True)
        self.request = rank_dir / REQUEST_NAME
        self.out = trial_dir / DIR_NAME / f"rank-{rank}.json"
        self.poll_s = poll_s

    def run(self) -> None:
        import time

        from torch._C._distributed_c10d import _dump_fr_trace_json

        while not self.request.exists():
            time.sleep(self.poll_s)
        data = _dump_fr_trace_json(includeCollectives=True, onlyActive=False)
        tmp = self.out.with_suffix(".tmp")
        try:
            tmp.write_bytes(data if isinstance(data, bytes) else str(data).encode())
            tmp.replace(self.out)
        except OSError:  # a full disk: no temporary left behind
            tmp.unlink(missing_ok=True)
            raise


def summarize_dump(data: dict[str, Any]) -> dict[str, Any]:
    """{entries, states (count per state), last: the last KEEP_ENTRIES entries as
    {seq, op, state, sizes, group}, unfinished: entries not completed} of one dump dict."""
    entries = data.get("entries") or []
    rows = [{"seq": e.get("collective_seq_id"), "op": e.get("profiling_name"),
             "state": e.get("state"), "sizes": e.get("input_sizes"),
             "group": (e.get("process_group") or [None])[0]} for e in entries]
    states: dict[str, int] = {}
    for row in rows:
        states[str(row["state"])] = states.get(str(row["state"]), 0) + 1
    return {"entries": len(rows), "states": states, "last": rows[-KEEP_ENTRIES:],
            "unfinished": [row for row in rows if row["state"] != "completed"]}


def collect(trial_dir: Path) -> list[dict[str, Any]]:
    """Every dump under <trial_dir>/flight-recorder/: {file, bytes, summary} or {file,
    bytes, unreadable: why}. JSON dumps (on request) and pickled dumps (on timeout)."""
    folder = trial_dir / DIR_NAME
    found = []
    for path in sorted(folder.glob("*")) if folder.is_dir() else []:
        if path.suffix == ".tmp" or not path.is_file():
            continue
        item: dict[str, Any] = {"file": path.name, "bytes": path.stat().st_size}
        try:
            raw = path.read_bytes()
            data = json.loads(raw) if path.suffix == ".json" else pickle.loads(raw)  # noqa: S301
            item["summary"] = summarize_dump(data)
        except Exception as exc:  # a torn or foreign file is reported, not fatal
            item["unreadable"] = f"{type(exc).__name__}: {exc}"
        found.append(item)
    return found
