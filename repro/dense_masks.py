"""Defect: attention that materialises dense S x S float masks and scores in every block.

Expected verdict: OOM under a memory cap on the child (memory grows quadratically with S:
each block keeps several [B, H, S, S] fp32 tensors alive for backward).
"""

from __future__ import annotations

import torch
from torch import nn

from repro._base import TinyLM


class DenseMaskAttention(nn.Module):
    def __init__(self, dim: int, heads: int = 4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        mask = torch.full((seq, seq), float("-inf")).triu(1)  # the defect: dense S x S
        scores = q @ k.transpose(-1, -2) / (dim // self.heads) ** 0.5 + mask
        probs = torch.softmax(scores, dim=-1)
        return x + self.out((probs @ v).transpose(1, 2).reshape(batch, seq, dim))


def make(n_layers: int = 4) -> nn.Module:
    return TinyLM([DenseMaskAttention(32) for _ in range(n_layers)])
