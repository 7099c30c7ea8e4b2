"""Defect: a block waits for a flag that nothing ever sets, polling it in a Python loop.

Expected verdict: STALL-BUSY. The main thread spins at full demand for the CPU (however
little of it a loaded machine gives) while its stack only revisits the same few lines and
no counter moves: no progress, and not a wait either. The hot frame is the polling loop.
"""

from __future__ import annotations

import torch
from torch import nn

from repro._base import ResidualMLP, TinyLM

_READY = {"flag": False}


def _ready() -> bool:
    return _READY["flag"]


class PollingBlock(ResidualMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while not _ready():  # the defect: nothing sets the flag
            pass
        return super().forward(x)


def make(n_layers: int = 2) -> nn.Module:
    return TinyLM([ResidualMLP(32) for _ in range(n_layers)] + [PollingBlock(32)])
