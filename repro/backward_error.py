"""Defect: a custom autograd Function whose backward raises deep inside the backward pass.

Expected verdict: ERROR, naming RuntimeError and its message.
"""

from __future__ import annotations

import torch
from torch import nn

from repro._base import ResidualMLP, TinyLM


class _Fragile(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("fragile backward: gradient buffer layout mismatch")


class FragileBlock(ResidualMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(_Fragile.apply(x))


def make(n_layers: int = 3) -> nn.Module:
    return TinyLM([ResidualMLP(32) for _ in range(n_layers - 1)] + [FragileBlock(32)])
