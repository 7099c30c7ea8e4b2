"""Defect: attention written as a Python loop over tokens with a host sync per token.

Expected verdict: SLOW. It always finishes, but time per step grows with S^2 and every
token costs a `.item()`; under a budget shorter than its run the heartbeat keeps arriving,
so the verdict is SLOW with a rate and an ETA — not a hang.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from repro._base import ResidualMLP, TinyLM


class LoopAttention(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        rows = []
        for t in range(x.shape[1]):  # the defect: one token at a time
            scores = (q[:, t:t + 1] @ k[:, : t + 1].transpose(1, 2)) / math.sqrt(x.shape[-1])
            if scores.abs().max().item() > 1e4:  # ... and a host sync per token
                scores = scores.clamp(-1e4, 1e4)
            rows.append(torch.softmax(scores, dim=-1) @ v[:, : t + 1])
        return x + self.out(torch.cat(rows, dim=1))


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.attn, self.mlp = LoopAttention(dim), ResidualMLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


def make(n_layers: int = 4) -> nn.Module:
    return TinyLM([Block(32) for _ in range(n_layers)])
