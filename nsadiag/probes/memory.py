"""Memory evidence: what a forward pass saves for backward, module by module, and the
allocator's view on CUDA.

`SavedTensorLedger` attributes every tensor autograd saves during a forward to the
innermost module running when it was saved — and, inside NSAAttention, to the NSA branch
function running (cmp/sel/win), through the same wrappers the trial heartbeat uses. Each
storage is counted once (views share it) and parameters not at all. This is what makes an
O(S^2) path visible on a CPU, where allocator statistics do not exist.

`LayerDeltas` measures, on CUDA, the allocated bytes each repeated block (layer) adds across
its forward; `per_layer` joins them with the ledger's bytes saved inside each block, so one
layer that keeps much more than its siblings stands out on any device.

`cuda_allocator_stats` reads torch.cuda.memory_stats and the segments of a memory snapshot;
on a machine without CUDA it returns one line saying so instead.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

TOP = "<outside any module>"


@dataclass
class SavedTensor:
    module: str
    shape: list[int]
    dtype: str
    nbytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SavedTensorLedger:
    """Context manager over one forward: `entries` lists what was saved, by module."""

    def __init__(self, model: nn.Module, branches: bool = True):
        self.model, self.branches = model, branches
        self.entries: list[SavedTensor] = []
        self._stack: list[str] = []
        self._seen: set[int] = set()
        self._params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._handles: list[Any] = []
        self._probe = None
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def __enter__(self) -> SavedTensorLedger:
        for name, module in self.model.named_modules():
            if name:
                self._handles.append(module.register_forward_pre_hook(self._push(name)))
                self._handles.append(module.register_forward_hook(self._pop, always_call=True))
        if self.branches:  # off where another BranchProbe (the trial heartbeat) is installed
            self._probe = _branch_probe(self.model, self.branch_event)
        self._saving.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._saving.__exit__(*exc)
        if self._probe is not None:
            self._probe.remove()
        for handle in self._handles:
            handle.remove()

    def _push(self, name: str):
        def hook(module: nn.Module, args: Any) -> None:
            self._stack.append(name)
        return hook

    def _pop(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def branch_event(self, name: str, phase: str, edge: str) -> None:
        """A BranchProbe event: forward enter/exit of an NSA branch (e.g. blocks.0.attn.sel)
        scopes what is saved meanwhile. Pass it on from a BranchProbe installed elsewhere
        (the trial heartbeat's) when this ledger was built with branches=False."""
        if phase != "forward":
            return
        if edge == "enter":
            self._stack.append(name)
        elif self._stack and self._stack[-1] == name:
            self._stack.pop()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._params and ptr not in self._seen:
            self._seen.add(ptr)
            self.entries.append(SavedTensor(self._stack[-1] if self._stack else TOP,
                                            list(tensor.shape), str(tensor.dtype).replace(
                                                "torch.", ""), storage.nbytes()))
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    @property
    def total(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def by_module(self) -> dict[str, int]:
        """Bytes saved while each module (innermost) was running, largest first."""
        totals: dict[str, int] = defaultdict(int)
        for entry in self.entries:
            totals[entry.module] += entry.nbytes
        return dict(sorted(totals.items(), key=lambda item: -item[1]))

    def by_branch(self) -> dict[str, int]:
        """Bytes saved inside each NSA branch (cmp/sel/win/select) over all layers."""
        totals: dict[str, int] = defaultdict(int)
        for entry in self.entries:
            suffix = entry.module.rsplit(".", 1)[-1]
            if suffix in ("cmp", "sel", "win", "select"):
                totals[suffix] += entry.nbytes
        return dict(totals)

    def largest(self, count: int = 10) -> list[SavedTensor]:
        return sorted(self.entries, key=lambda e: -e.nbytes)[:count]


class LayerDeltas:
    """Context manager over one forward: `deltas[name]` is torch.cuda.memory_allocated()
    after the block's first forward minus before it (bytes the forward left allocated:
    its output and what it saved). Empty off CUDA. The counter is read on the host;
    nothing synchronises."""

    def __init__(self, blocks: list[tuple[str, nn.Module]], device: torch.device):
        self.blocks, self.device = blocks, device
        self.deltas: dict[str, int] = {}
        self._before: dict[str, int] = {}
        self._handles: list[Any] = []

    def __enter__(self) -> LayerDeltas:
        if self.device.type == "cuda":
            for name, block in self.blocks:
                self._handles.append(block.register_forward_pre_hook(self._enter(name)))
                self._handles.append(block.register_forward_hook(self._exit(name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()

    def _enter(self, name: str):
        def hook(module: nn.Module, args: Any) -> None:
            self._before.setdefault(name, torch.cuda.memory_allocated(self.device))
        return hook

    def _exit(self, name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if name in self._before and name not in self.deltas:
                self.deltas[name] = torch.cuda.memory_allocated(self.device) - \
                    self._before[name]
        return hook


def per_layer(ledger: SavedTensorLedger, blocks: list[tuple[str, nn.Module]],
              deltas: dict[str, int]) -> list[dict[str, Any]]:
    """One row per block in forward order: {layer, saved, cuda_delta (None off CUDA)}.
    A block's saved bytes are those saved while it or any of its submodules ran."""
    saved = {name: 0 for name, _ in blocks}
    for entry in ledger.entries:
        for name in saved:
            if entry.module == name or entry.module.startswith(name + "."):
                saved[name] += entry.nbytes
                break
    return [{"layer": name, "saved": saved[name], "cuda_delta": deltas.get(name)}
            for name, _ in blocks]


def standouts(rows: list[dict[str, Any]], factor: float = 4.0) -> list[str]:
    """Layers that saved more than `factor` times the median of the layers' saved bytes."""
    values = sorted(row["saved"] for row in rows)
    if len(values) < 3:
        return []
    median = values[len(values) // 2]
    return [row["layer"] for row in rows if row["saved"] > factor * max(median, 1)]


def _branch_probe(model: nn.Module, emit):
    """The NSA branch wrappers when the model has NSAAttention layers, else None."""
    from nsadiag.builtin import nsa_attention_class
    from nsadiag.targets import BranchProbe

    nsa_attention = nsa_attention_class()
    if nsa_attention is not None and any(isinstance(m, nsa_attention)
                                         for m in model.modules()):
        return BranchProbe(model, emit)
    return None


def cuda_allocator_stats(device: torch.device) -> dict[str, Any] | str:
    """Allocator counters and fragmentation on CUDA; a one-line reason elsewhere."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return "CUDA allocator statistics: not available on this device"
    stats = torch.cuda.memory_stats(device)
    allocated = stats.get("allocated_bytes.all.current", 0)
    reserved = stats.get("reserved_bytes.all.current", 0)
    result = {"allocated": allocated, "reserved": reserved,
              "active": stats.get("active_bytes.all.current", 0),
              "inactive_split": stats.get("inactive_split_bytes.all.current", 0),
              "peak_allocated": stats.get("allocated_bytes.all.peak", 0),
              "peak_reserved": stats.get("reserved_bytes.all.peak", 0),
              "fragmentation": (reserved - allocated) / reserved if reserved else 0.0,
              "num_alloc_retries": stats.get("num_alloc_retries", 0),
              "num_ooms": stats.get("num_ooms", 0)}
    try:
        segments = torch.cuda.memory_snapshot()
        free_blocks = [block["size"] for segment in segments for block in segment["blocks"]
                       if block["state"] == "inactive"]
        result["largest_free_block"] = max(free_blocks, default=0)
    except RuntimeError as err:
        result["largest_free_block"] = f"unavailable ({err})"
    return result
