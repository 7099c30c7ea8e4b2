"""StacksRecord: a stacks run's stacks.json, parsed once where it is read.

stacks.json is what ``nsadiag.commands.stacks`` sampled: every process (or rank) with its
state, CPU share, innermost-frames signature, what could not be read, and every stack
sample; the clusters of processes by signature and the odd ones out.
``StacksRecord.from_dict`` checks each field's type and parses the samples
(``nsadiag.evidence.StackSample``); KeyError or TypeError name what is missing or wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nsadiag.evidence import StackSample


@dataclass(frozen=True)
class SampledProcess:
    """One process of stacks.json."""

    pid: int
    rank: int | None
    cmdline: str | None
    state: str | None
    cpu_fraction: float | None
    signature: str | None
    unavailable: tuple[str, ...]
    samples: tuple[StackSample, ...]

    @classmethod
    def from_dict(cls, data: Any) -> SampledProcess:
        if not isinstance(data, dict):
            raise TypeError(f"stacks.json: a process is a {type(data).__name__}")
        for name, kinds in _PROCESS_TYPES.items():
            value = data[name]
            if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
                raise TypeError(f"stacks.json: a process's {name} is a "
                                f"{type(value).__name__}")
        if data["pid"] is None or not isinstance(data["samples"], list):
            raise TypeError("stacks.json: a process lacks its pid or its samples")
        return cls(pid=data["pid"], rank=data["rank"], cmdline=data["cmdline"],
                   state=data["state"], cpu_fraction=data["cpu_fraction"],
                   signature=data["signature"], unavailable=tuple(data["unavailable"] or ()),
                   samples=tuple(StackSample.from_dict(s) for s in data["samples"]))


_PROCESS_TYPES: dict[str, type | tuple[type, ...]] = {
    "pid": int, "rank": int, "cmdline": str, "state": str, "cpu_fraction": (int, float),
    "signature": str, "unavailable": list, "samples": list}


@dataclass(frozen=True)
class StacksRecord:
    """What one `nsadiag stacks` sampled."""

    processes: tuple[SampledProcess, ...]
    clusters: tuple[Mapping[str, Any], ...]
    """Processes grouped by signature, as stored: {"signature", "members": [pid, ...]}."""
    odd_ones_out: tuple[int, ...]

    @classmethod
    def from_dict(cls, data: Any) -> StacksRecord:
        """stacks.json's object; KeyError or TypeError naming what is missing or wrong."""
        if not isinstance(data, dict):
            raise TypeError(f"stacks.json: not an object but {type(data).__name__}")
        for name in ("processes", "clusters", "odd_ones_out"):
            if not isinstance(data[name], list):
                raise TypeError(f"stacks.json: {name} is a {type(data[name]).__name__}")
        if not all(isinstance(c, dict) for c in data["clusters"]):
            raise TypeError("stacks.json: a cluster is not an object")
        return cls(processes=tuple(SampledProcess.from_dict(p) for p in data["processes"]),
                   clusters=tuple(data["clusters"]),
                   odd_ones_out=tuple(int(pid) for pid in data["odd_ones_out"]))
