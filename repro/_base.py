"""A tiny token model to host one defect: embed -> N x block -> head."""

from __future__ import annotations

import torch
from torch import nn


class ResidualMLP(nn.Module):
    """A healthy block: x + W2 gelu(W1 x)."""

    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


class TinyLM(nn.Module):
    """ids [B, S] -> logits [B, S, vocab]; `blocks` is what the heartbeat watches."""

    def __init__(self, blocks: list[nn.Module], dim: int = 32, vocab: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids % self.embed.num_embeddings)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
