"""A healthy target whose work grows as S^3, for tests/nsadiag/checks/test_check_budget.py: at
S=2048 a correctness check outlasts any short budget, at S=512 it takes a fraction of a
second.

    size_bound   embed -> n_layers x SizeBoundBlock (checkpointed with grad_ckpt) -> head;
                 each block is one causal attention; above S=512 it also computes, on the
                 CPU, for (S / 512)^3 seconds: S=2048 needs minutes on any machine, S=512
                 a fraction of a second (a wall-clock cost, so a fast machine cannot finish
                 it early, and the values stay bounded)
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from tests.check_targets import CheckpointedTinyLM
from tests.diag_targets import DIM


class SizeBoundBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq_len = x.shape[1]
        if seq_len > 512:
            busy = torch.ones(64, 64)
            until = time.monotonic() + (seq_len / 512) ** 3
            while time.monotonic() < until:
                busy = torch.tanh(busy @ busy)
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        return x + 0.1 * F.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1)


def size_bound(n_layers: int = 2, grad_ckpt: bool = False) -> nn.Module:
    model = CheckpointedTinyLM(n_layers, grad_ckpt)
    model.layers = nn.ModuleList(SizeBoundBlock(DIM) for _ in range(n_layers))
    return model
