"""Attention over compressed tokens, memory-bounded (flash-style) torch implementation.

Layout: q [B, S, Hq, D]; k_cmp, v_cmp [B, N, Hkv, D]; query head h reads kv head h // G.
Compressed token i summarises raw keys [i*stride, i*stride + block_len) and is visible to
query t iff it is complete: i*stride + block_len - 1 <= t. A query that sees no token
(t < block_len - 1, or N = 0 when S < block_len) gets o = 0 and lse = -inf, zero gradients.

The log-sum-exp (fp32 [B, S, Hq], in units of scale * q.k) is returned alongside o and
marked non-differentiable. Block selection does not reuse it: its own softmax costs no more
on the CPU (measured) and keeps the chosen blocks independent of this op's rounding.
Tile [t0, t1) reads only the visible prefix of compressed tokens (bounded by its last
query); the tokens its first query already sees need no mask (`_tiles`, the band's k_open).
Backward saves only q, k_cmp, v_cmp, o and lse and recomputes the probabilities tile by
tile; gradients reach q, k_cmp and v_cmp.
"""

from __future__ import annotations

import functools

import torch

from nsa.ops.torch._tiles import DenseBandAttention, check_chunk, check_layout, resolve_scale

__all__ = ["compressed_attention"]


def _n_visible(n_cmp: int, block_len: int, stride: int, t: int) -> int:
    """Compressed tokens visible to query t: i*stride + block_len - 1 <= t."""
    return 0 if t < block_len - 1 else min(n_cmp, (t - block_len + 1) // stride + 1)


def _compressed_band(n_cmp: int, block_len: int, stride: int, t0: int, t1: int,
                     device: torch.device) -> tuple[int, int, int, torch.Tensor]:
    # every query of the tile sees what its first one sees; its last one sees the most
    k_open = _n_visible(n_cmp, block_len, stride, t0)
    n_visible = _n_visible(n_cmp, block_len, stride, t1 - 1)
    t = torch.arange(t0, t1, device=device).unsqueeze(1)
    last_key = torch.arange(k_open, n_visible, device=device).unsqueeze(0) * stride
    return 0, k_open, n_visible, last_key + block_len - 1 > t


def compressed_attention(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor,
                         block_len: int, stride: int, scale: float | None = None,
                         query_chunk: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, non-differentiable); see the module docstring."""
    check_layout(q, k_cmp, v_cmp)
    for name, value in (("block_len", block_len), ("stride", stride)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    band = functools.partial(_compressed_band, k_cmp.shape[1], block_len, stride)
    return DenseBandAttention.apply(q, k_cmp, v_cmp, band, resolve_scale(q.shape[-1], scale),
                                    check_chunk(query_chunk))
