"""The training heartbeat: one flushed JSON line per event and rank ("start", one "step" per
optimizer step with loss, lr, grad norm, throughput and memory, "end" with the status)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

import psutil
import torch

from nsa.training.options import TrainArgs
from nsa.training.runtime import Runtime


def heartbeat_path(args: TrainArgs, runtime: Runtime) -> Path | None:
    """--heartbeat PATH ('{rank}' is filled in; several ranks get -rank{r} appended), else
    OUT/heartbeat-rank{r}.jsonl, else None (no heartbeat)."""
    rank = runtime.rank
    if args.heartbeat:
        if "{rank}" in args.heartbeat:
            return Path(args.heartbeat.replace("{rank}", str(rank)))
        path = Path(args.heartbeat)
        if runtime.world_size > 1:
            path = path.with_name(f"{path.stem}-rank{rank}{path.suffix}")
        return path
    if args.out:
        return Path(args.out) / f"heartbeat-rank{rank}.jsonl"
    return None


class Heartbeat:
    """Appends one flushed JSON object per event: {"t", "event", "rank", "world_size", ...}."""

    def __init__(self, path: Path | None, runtime: Runtime):
        self.runtime = runtime
        self.process = psutil.Process()
        self.file: TextIO | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "a", encoding="utf-8")

    def write(self, event: str, **fields: Any) -> None:
        if self.file is None:
            return
        record = {"t": time.time(), "event": event, "rank": self.runtime.rank,
                  "world_size": self.runtime.world_size, **fields}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def memory(self) -> dict[str, int]:
        """rss_bytes, plus cuda_allocated / cuda_reserved on a CUDA device."""
        stats = {"rss_bytes": self.process.memory_info().rss}
        if self.runtime.device.type == "cuda":
            stats["cuda_allocated"] = torch.cuda.memory_allocated(self.runtime.device)
            stats["cuda_reserved"] = torch.cuda.memory_reserved(self.runtime.device)
        return stats

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
