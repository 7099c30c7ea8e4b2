"""Targets with one correctness defect each, for tests/test_checks.py.

    future_peek        block `peek_layer` mixes in the next token's features: x[:, t + 1]
    broken_backend     NSA model whose non-naive attention path is off by 1%
    checkpointed_tiny  a healthy TinyLM that honours grad_ckpt (a factory target that passes)
    drifting_recompute checkpointed TinyLM whose layer 1 returns something else each call
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from nsa.config import NSAConfig
from nsa.layer import NSAAttention
from nsa.model import NSATransformer
from tests.diag_targets import DIM, TinyBlock, TinyLM

TINY_NSA = dict(dim=32, n_heads=4, n_kv_heads=2, head_dim=8, l=8, d=4, l_sel=16, n_sel=3,
                w=16, vocab_size=64)


class PeekingBlock(TinyBlock):
    """x_t + tanh(W x_t) + 0.5 * x_{t+1}: position t sees the token after it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ahead = F.pad(x[:, 1:], (0, 0, 0, 1))  # row t holds x[:, t + 1]; the last row zeros
        return super().forward(x) + 0.5 * ahead


def future_peek(n_layers: int = 3, peek_layer: int = 1) -> TinyLM:
    model = TinyLM(n_layers)
    model.layers[peek_layer] = PeekingBlock(DIM)
    return model


class SkewedAttention(NSAAttention):
    """The torch path's branch mix scaled by 1.01: forward and gradients off by 1%."""

    def _mix_branches(self, *args):
        return super()._mix_branches(*args) * 1.01


def broken_backend(n_layers: int = 2) -> NSATransformer:
    cfg = NSAConfig(**TINY_NSA, n_layers=n_layers, backend="torch")
    model = NSATransformer(cfg)
    for block in model.blocks:
        skewed = SkewedAttention(cfg)
        skewed.load_state_dict(block.attn.state_dict())
        block.attn = skewed
    return model


class CheckpointedTinyLM(TinyLM):
    def __init__(self, n_layers: int, grad_ckpt: bool):
        super().__init__(n_layers)
        self.grad_ckpt = grad_ckpt

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            use = self.grad_ckpt and torch.is_grad_enabled()
            x = checkpoint(layer, x, use_reentrant=False) if use else layer(x)
        return self.head(x)


def checkpointed_tiny(n_layers: int = 3, grad_ckpt: bool = False) -> nn.Module:
    return CheckpointedTinyLM(n_layers, grad_ckpt)


class DropoutBlock(TinyBlock):
    """A healthy block with dropout: checkpoint recompute restores the RNG, so it is exact."""

    def __init__(self, dim: int):
        super().__init__(dim)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(super().forward(x))


def dropout_tiny(n_layers: int = 3, grad_ckpt: bool = False) -> nn.Module:
    model = CheckpointedTinyLM(n_layers, grad_ckpt)
    for i in range(n_layers):
        model.layers[i] = DropoutBlock(DIM)
    return model


class DriftingBlock(TinyBlock):
    """Input scaled by 1 + 1e-3 * (calls so far): its checkpoint recompute is not exact."""

    def __init__(self, dim: int):
        super().__init__(dim)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x * (1 + 1e-3 * self.calls))


def drifting_recompute(n_layers: int = 3, grad_ckpt: bool = False) -> nn.Module:
    model = CheckpointedTinyLM(n_layers, grad_ckpt)
    model.layers[1] = DriftingBlock(DIM)
    return model
