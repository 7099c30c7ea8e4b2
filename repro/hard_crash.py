"""Defect: native code dereferences a null pointer in the middle of a forward pass.

Expected verdict: CRASH, naming SIGSEGV.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from repro._base import ResidualMLP, TinyLM


class CrashingBlock(ResidualMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctypes.string_at(0)  # the defect: reads address 0 -> SIGSEGV
        return super().forward(x)


def make(n_layers: int = 2) -> nn.Module:
    return TinyLM([ResidualMLP(32) for _ in range(n_layers - 1)] + [CrashingBlock(32)])
