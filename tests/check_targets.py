"""Targets with one correctness defect each, for tests/nsadiag/checks/test_checks.py.

    future_peek        block `peek_layer` mixes in the next token's features: x[:, t + 1]
    broken_backend     NSA model whose non-naive attention path is off by 1%
    checkpointed_tiny  a healthy TinyLM that honours grad_ckpt (a factory target that passes)
    drifting_recompute checkpointed TinyLM whose layer 1 returns something else each call
    window_leak        a sliding-window mix (w = 512) computed in chunks of w queries whose
                       last query also reads the next chunk's first key: causal up to S = w
    shared_input_recompute  checkpointed blocks whose W_Q, W_K and W_V all take the same
                       input; W_K's input differs between the forward and its recompute
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


WINDOW = 512


class ChunkedWindowMix(nn.Module):
    """x_t + W(mean of x over the window [t - WINDOW + 1, t]), computed in chunks of WINDOW
    queries, each against its keys [start - WINDOW + 1, end]. The defect: a chunk's key
    range runs one key past the chunk (``end + 1``) and its mask lets the chunk's last
    query take that key, so position end - 1 reads position end. With S <= WINDOW there is
    one chunk and no key past it: the leak needs S > WINDOW."""

    def __init__(self, dim: int):
        super().__init__()
        self.mix = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        S = x.shape[1]
        means = []
        for start in range(0, S, WINDOW):
            end = min(start + WINDOW, S)
            low, high = max(0, start - WINDOW + 1), min(end + 1, S)  # the defect: end + 1
            queries = torch.arange(start, end)[:, None]
            keys = torch.arange(low, high)[None, :]
            visible = (keys > queries - WINDOW) & ((keys <= queries) |
                                                   ((queries == end - 1) & (keys == end)))
            weights = visible.float() / visible.sum(-1, keepdim=True)
            means.append(torch.einsum("qk,bkd->bqd", weights, x[:, low:high]))
        return x + self.mix(torch.cat(means, dim=1))


def window_leak(n_layers: int = 2) -> TinyLM:
    model = TinyLM(n_layers)
    model.layers[n_layers - 1] = ChunkedWindowMix(DIM)
    return model


class SharedInputAttention(nn.Module):
    """q, k, v = W_Q(x), W_K(x'), W_V(x), mixed causally. The defect: x' is x scaled by a
    factor the block changes after each call (a stateful input path), so the checkpoint
    recompute of W_K receives x itself, which is exactly what W_Q and W_V received in the
    forward, while W_K's forward received x * 1.5."""

    def __init__(self, dim: int):
        super().__init__()
        self.W_Q, self.W_K, self.W_V = (nn.Linear(dim, dim) for _ in range(3))
        self.scale = 1.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.W_Q(x), self.W_K(x * self.scale if self.scale != 1.0 else x), self.W_V(x)
        self.scale = 1.0
        scores = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
        causal = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
        attended = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v
        return x + attended


def shared_input_recompute(n_layers: int = 2, grad_ckpt: bool = False) -> nn.Module:
    model = CheckpointedTinyLM(n_layers, grad_ckpt)
    for i in range(n_layers):
        model.layers[i] = SharedInputAttention(DIM)
    return model
