"""NSATransformer: a decoder-only language model with NSA attention.

token ids [B, S] -> logits [B, S, vocab]:
  embed -> N x Block -> RMSNorm -> LM head
  Block(x) = x + NSAAttention(RMSNorm(x)); then x + SwiGLU(RMSNorm(x))
With cfg.grad_ckpt each block is checkpointed (use_reentrant=False) while training: the
block module itself is handed to checkpoint(), so recompute always re-runs that same block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from nsa.config import NSAConfig
from nsa.layer import NSAAttention


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: NSAConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = NSAAttention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.dim, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class NSATransformer(nn.Module):
    def __init__(self, cfg: NSAConfig):
        super().__init__()
        self.cfg = cfg.validate()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        self.apply(_init_weights)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, S] int64 -> logits [B, S, vocab]."""
        x = self.embed(ids)
        for block in self.blocks:
            if self.cfg.grad_ckpt and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        """Next-token cross entropy of ids [B, S] (predicting ids[:, 1:])."""
        logits = self(ids[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
