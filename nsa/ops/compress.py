"""phi: block compression of keys or values (NSA §3.3.1).

Compressed token i summarises the raw tokens [i*d, i*d + l) of one head:
    mlp:  phi(x) = W2 . gelu(W1 . flatten(x[i*d : i*d+l] + pos_emb) + b1) + b2
          (pos_emb [l, D] is the intra-block position embedding; weights shared by heads)
    mean: phi(x) = mean(x[i*d : i*d+l])  (no parameters)
A sequence of S tokens has N = (S - l) // d + 1 compressed tokens (0 when S < l).
"""

from __future__ import annotations

import torch
from torch import nn

from nsa.config import NSAConfig, num_compressed


class Compressor(nn.Module):
    """[B, S, H, D] -> [B, N, H, D]; see the module docstring for phi."""

    def __init__(self, cfg: NSAConfig):
        super().__init__()
        self.block_len, self.stride, self.kind = cfg.l, cfg.d, cfg.compressor
        self.cfg = cfg
        if self.kind == "mlp":
            self.pos_emb = nn.Parameter(torch.randn(cfg.l, cfg.head_dim) * 0.02)
            self.fc1 = nn.Linear(cfg.l * cfg.head_dim, cfg.phi_hidden)
            self.fc2 = nn.Linear(cfg.phi_hidden, cfg.head_dim)

    def summarize(self, windows: torch.Tensor) -> torch.Tensor:
        """phi of explicit windows: [..., l, D] -> [..., D]."""
        if self.kind == "mean":
            return windows.mean(dim=-2)
        flat = (windows + self.pos_emb.to(windows.dtype)).flatten(-2)
        return self.fc2(nn.functional.gelu(self.fc1(flat)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, heads, dim = x.shape
        n_cmp = num_compressed(seq, self.cfg)
        if n_cmp == 0:
            return x.new_zeros(batch, 0, heads, dim)
        windows = x.unfold(1, self.block_len, self.stride)  # [B, N, H, D, l], a view
        return self.summarize(windows.transpose(-1, -2))
