"""MemoryRecord: a memory run's memory.json, parsed once where it is read.

memory.json is what ``nsadiag.harness.memory`` measured (the bytes the first forward saved
for backward, in all and per module, NSA branch and layer; the largest saved tensors; the
step time and peak RSS; on CUDA the allocator's counters and the memory history) and, when
asked for, the expandable-segments A/B. ``MemoryRecord.from_dict`` checks the fields the
report reads and keeps the stored order, so ``to_dict`` writes the same object back (the
report's summary.json copies it). The allocator counters, the history's summary and the A/B
are shown as stored, so they stay JSON objects here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nsadiag.probes.gpu import GpuState, gpu_json, gpu_of


@dataclass(frozen=True)
class LayerSaved:
    """One layer's row: the bytes it saved for backward, and on CUDA how much the allocator's
    allocated bytes grew over its forward (None off CUDA)."""

    layer: str
    saved: int
    cuda_delta: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "saved": self.saved, "cuda_delta": self.cuda_delta}


@dataclass(frozen=True)
class SavedTensor:
    """One of the largest tensors saved for backward, and the module that saved it."""

    module: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "shape": list(self.shape), "dtype": self.dtype,
                "nbytes": self.nbytes}


@dataclass(frozen=True)
class MemoryRecord:
    """What one `nsadiag memory` measured (nsadiag.harness.memory documents each field)."""

    device: str
    saved_total: int
    step_s: float
    peak_rss: int
    saved_by_module: Mapping[str, int] = field(default_factory=dict)
    saved_by_branch: Mapping[str, int] = field(default_factory=dict)
    per_layer: tuple[LayerSaved, ...] = ()
    layer_standouts: tuple[str, ...] = ()
    largest_saved: tuple[SavedTensor, ...] = ()
    cuda: Mapping[str, Any] | str = ""
    """The allocator's counters, or why there are none (not a CUDA device)."""
    history: Mapping[str, Any] = field(default_factory=dict)
    """The memory history: {"unavailable": why} or {"snapshot": path, "summary": {...}}."""
    gpu: GpuState | None = None
    ab_expandable_segments: Mapping[str, Any] | None = None
    keys: tuple[str, ...] = ()
    """The stored keys, in their stored order (what ``to_dict`` writes)."""

    @classmethod
    def from_dict(cls, data: Any) -> MemoryRecord:
        """memory.json's object; KeyError or TypeError naming what is missing or wrong."""
        if not isinstance(data, dict):
            raise TypeError(f"memory.json: not an object but {type(data).__name__}")
        _need(data, "device", str)
        _need(data, "saved_total", int)
        _need(data, "peak_rss", int)
        _need(data, "step_s", (int, float))
        for name in ("saved_by_module", "saved_by_branch", "history"):
            _need(data, name, dict, optional=True)
        for name in ("per_layer", "layer_standouts", "largest_saved"):
            _need(data, name, list, optional=True)
        _need(data, "cuda", (dict, str))
        _need(data, "ab_expandable_segments", dict, optional=True)
        return cls(
            device=data["device"], saved_total=data["saved_total"], step_s=data["step_s"],
            peak_rss=data["peak_rss"], saved_by_module=dict(data.get("saved_by_module") or {}),
            saved_by_branch=dict(data.get("saved_by_branch") or {}),
            per_layer=tuple(LayerSaved(str(r["layer"]), int(r["saved"]), r["cuda_delta"])
                            for r in data.get("per_layer") or ()),
            layer_standouts=tuple(str(name) for name in data.get("layer_standouts") or ()),
            largest_saved=tuple(SavedTensor(str(t["module"]), tuple(t["shape"]),
                                            str(t["dtype"]), int(t["nbytes"]))
                                for t in data.get("largest_saved") or ()),
            cuda=data.get("cuda"), history=dict(data.get("history") or {}),
            gpu=gpu_of(data.get("gpu")),
            ab_expandable_segments=data.get("ab_expandable_segments"),
            keys=tuple(key for key in data if key in _NAMED))

    def to_dict(self) -> dict[str, Any]:
        """memory.json's object, as it was stored."""
        rows = {"per_layer": [r.to_dict() for r in self.per_layer],
                "largest_saved": [t.to_dict() for t in self.largest_saved],
                "layer_standouts": list(self.layer_standouts), "gpu": gpu_json(self.gpu),
                "saved_by_module": dict(self.saved_by_module),
                "saved_by_branch": dict(self.saved_by_branch), "history": dict(self.history)}
        return {key: rows[key] if key in rows else getattr(self, key) for key in self.keys}


_NAMED = {name for name in MemoryRecord.__dataclass_fields__ if name != "keys"}


def _need(data: dict[str, Any], name: str, kinds: type | tuple[type, ...],
          optional: bool = False) -> None:
    """KeyError when ``name`` is missing (and not optional), TypeError when its value is of
    another JSON type (a bool is no number)."""
    if optional and data.get(name) is None:
        return
    value = data[name]
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise TypeError(f"memory.json: {name} is a {type(value).__name__}")
