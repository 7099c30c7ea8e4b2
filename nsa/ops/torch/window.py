"""Sliding-window attention, memory-bounded (flash-style) torch implementation.

Layout: q [B, S, Hq, D]; k, v [B, S, Hkv, D]; query head h reads kv head h // G, G = Hq // Hkv.
Query t attends keys s with t - window < s <= t (the window includes t itself, so
window = 1 sees only the diagonal, and window >= S is plain causal attention).

Queries are processed `query_chunk` at a time; tile [t0, t1) reads the contiguous key slice
[max(0, t0 - window + 1), t1) and masks the band, so forward time and temporaries are
O(S * (query_chunk + window)). Backward saves only q, k, v, the output and the fp32
log-sum-exp [B, S, Hq] and recomputes the probabilities tile by tile.
Compute is fp32; outputs and gradients come back in the input dtype.
"""

from __future__ import annotations

import functools

import torch

from nsa.ops.torch._tiles import DenseBandAttention, check_chunk, check_layout, resolve_scale

__all__ = ["window_attention", "window_attention_with_lse"]


def _window_band(window: int, t0: int, t1: int,
                 device: torch.device) -> tuple[int, int, torch.Tensor]:
    k0 = max(0, t0 - window + 1)
    t = torch.arange(t0, t1, device=device).unsqueeze(1)
    s = torch.arange(k0, t1, device=device).unsqueeze(0)
    return k0, t1, (s > t) | (s <= t - window)


def window_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                              scale: float | None = None,
                              query_chunk: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, non-differentiable) of sliding-window attention."""
    check_layout(q, k, v)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k: must have the query length {q.shape[1]}, got {k.shape[1]}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window: must be a positive integer, got {window!r}")
    band = functools.partial(_window_band, window)
    return DenseBandAttention.apply(q, k, v, band, resolve_scale(q.shape[-1], scale),
                                    check_chunk(query_chunk))


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                     scale: float | None = None, query_chunk: int = 128) -> torch.Tensor:
    """o [B, S, Hq, D] of sliding-window attention; see the module docstring."""
    return window_attention_with_lse(q, k, v, window, scale, query_chunk)[0]
