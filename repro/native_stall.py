"""Defect: one block makes a single native call that runs for minutes, so neither a
heartbeat nor any Python-level progress (a loop variable, a module call, an autograd node)
appears while it works.

Expected verdict: STALL-BUSY. No progress for the stall timeout, while the process keeps
(close to) a full core busy in native matmul code; the hot frame is this block's forward.
(A Python loop of short matmuls would be progress: SLOW, with the loop named.)
"""

from __future__ import annotations

import torch
from torch import nn

from repro._base import ResidualMLP, TinyLM

SIZE = 4096
POWER = 2**62 - 1  # ~124 products of 4096 x 4096 matrices (17 TFLOP) inside one call


class GrindingBlock(ResidualMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = torch.randn(SIZE, SIZE) / SIZE**0.5
        acc = torch.linalg.matrix_power(m, POWER)  # the defect: minutes in one native call
        return super().forward(x) + 0 * acc.sum()


def make(n_layers: int = 2) -> nn.Module:
    return TinyLM([ResidualMLP(32) for _ in range(n_layers)] + [GrindingBlock(32)])
