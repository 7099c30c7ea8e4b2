"""Defect: one block runs a long chain of native matrix products with no module boundary
inside it, so no heartbeat arrives while it works.

Expected verdict: STALL-BUSY. No heartbeat for the stall timeout, while the process keeps
(close to) a full core busy in native matmul code; the hot frame is this block's forward.
"""

from __future__ import annotations

import torch
from torch import nn

from repro._base import ResidualMLP, TinyLM


class GrindingBlock(ResidualMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = torch.randn(512, 512) / 512 ** 0.5
        acc = torch.eye(512)
        for _ in range(1_000_000):  # the defect: minutes of matmuls inside one module
            acc = acc @ m
        return super().forward(x) + 0 * acc.sum()


def make(n_layers: int = 2) -> nn.Module:
    return TinyLM([ResidualMLP(32) for _ in range(n_layers)] + [GrindingBlock(32)])
