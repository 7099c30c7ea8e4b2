"""Defect: a backward hook takes a lock that the forward pass took and never released.

Expected verdict: DEADLOCK. Backward blocks in `Lock.acquire` forever; the process uses no
CPU and its stacks do not change between samples.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from repro._base import ResidualMLP, TinyLM

_LOCK = threading.Lock()


class GuardedBlock(ResidualMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _LOCK.acquire(blocking=False)  # the defect: taken here, released nowhere
        return super().forward(x)


def _wait_for_lock(module, grad_output):
    with _LOCK:
        return None


def make(n_layers: int = 3) -> nn.Module:
    blocks = [ResidualMLP(32) for _ in range(n_layers)]
    guarded = GuardedBlock(32)
    guarded.register_full_backward_pre_hook(_wait_for_lock)
    return TinyLM(blocks + [guarded])
