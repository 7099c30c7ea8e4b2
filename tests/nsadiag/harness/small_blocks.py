"""The model shape where a per-block cost of the observer shows (many tiny residual blocks),
and a deadline wait, for the observer's overhead tests."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn


class SmallBlock(nn.Module):
    """Linear, LayerNorm and GELU on a residual: a block of about 0.1 ms."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear, self.norm, self.act = nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.norm(self.linear(x)))


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Whether ``condition`` held within ``timeout_s`` (polled every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()
