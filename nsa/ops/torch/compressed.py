"""Attention over compressed tokens, memory-bounded (flash-style) torch implementation.

Layout: q [B, S, Hq, D]; k_cmp, v_cmp [B, N, Hkv, D]; query head h reads kv head h // G.
Compressed token i summarises raw keys [i*stride, i*stride + block_len) and is visible to
query t iff it is complete: i*stride + block_len - 1 <= t. A query that sees no token
(t < block_len - 1, or N = 0 when S < block_len) gets o = 0 and lse = -inf, zero gradients.

The log-sum-exp (fp32 [B, S, Hq], in units of scale * q.k) is returned alongside o and
marked non-differentiable. Tile [t0, t1) reads only the visible prefix of compressed tokens
(bounded by its last query); the tokens its first query already sees need no mask (`_tiles`,
the band's k_open). Backward saves only q, k_cmp, v_cmp, o and lse and recomputes the
probabilities tile by tile; gradients reach q, k_cmp and v_cmp.

`compressed_attention_and_selection` also returns the selected branch's block indices:
Eq.8's probabilities are this branch's attention weights, so one pass per query tile
computes them once (`nsa.ops.selection.CompressedTiles`, the code `select_blocks` runs, hence
the same indices bit for bit), multiplies them into v_cmp and ranks the blocks from them.
When `nsa.ops.shift` finds the call's logits small enough, a tile is one matmul, one exp
pass and one matmul, with no row maximum (the common case); otherwise the logits are shifted
by their row maximum. On the CPU at S = 32k that forward takes 0.8 s against 1.0 s for the
row-maximum form and 1.4 s for the fused flash forward plus a separate selection; backward
is the same as `compressed_attention`'s.
"""

from __future__ import annotations

import functools
import math

import torch

from nsa.config import NSAConfig
from nsa.ops import selection
from nsa.ops.torch._tiles import (
    DenseBandAttention,
    check_chunk,
    check_layout,
    dense_backward,
    resolve_scale,
)
from nsa.ops.workspace import Workspace

__all__ = ["compressed_attention", "compressed_attention_and_selection"]


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


@torch.no_grad()
def _forward_with_selection(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor,
                            cfg: NSAConfig, scale: float, query_chunk: int):
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, block indices [B, S, Hkv, n_sel])."""
    batch, seq, n_q_heads, head_dim = q.shape
    n_kv_heads = k_cmp.shape[2]
    group = n_q_heads // n_kv_heads
    tiles = selection.CompressedTiles(q, k_cmp, cfg, scale, Workspace(q.device))
    # [B*Hkv, N, D]: one contiguous value matrix per (batch, kv head)
    values = v_cmp.float().transpose(1, 2).reshape(batch * n_kv_heads, -1, head_dim)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    indices = torch.empty(batch, seq, n_kv_heads, cfg.n_sel, dtype=torch.long, device=q.device)

    def heads_last(x: torch.Tensor, n_tile: int) -> torch.Tensor:  # [B*Hkv, T*G, ...]
        x = x.view(batch, n_kv_heads, n_tile, group, *x.shape[2:]).transpose(1, 2)
        return x.flatten(2, 3)  # [B, T, Hq, ...]

    for start in range(0, seq, query_chunk):
        stop = min(start + query_chunk, seq)
        tile = tiles.weights(start, stop)
        indices[:, start:stop] = tiles.block_indices(tile, start, stop)
        if tile is None:  # no query of the tile sees a token
            o[:, start:stop] = 0.0
            lse[:, start:stop] = -math.inf
            continue
        n_vis = tile.weights.shape[-1]
        tile_o = torch.bmm(tile.weights, values[:, :n_vis],
                           out=tiles.ws.take("o", *tile.weights.shape[:2], head_dim))
        inverse = torch.where(tile.row_sum > 0, tile.row_sum.reciprocal(), 0.0)
        o[:, start:stop] = heads_last(tile_o.mul_(inverse.unsqueeze(-1)), stop - start)
        lse[:, start:stop] = heads_last(tile.lse(), stop - start)
    return o, lse, indices


class _CompressedWithSelection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor,
                cfg: NSAConfig, scale: float, query_chunk: int):
        # scores stay fp32 inside autocast regions: bf16 would change which blocks win
        with torch.autocast(q.device.type, enabled=False):
            o, lse, indices = _forward_with_selection(q, k_cmp, v_cmp, cfg, scale, query_chunk)
        ctx.save_for_backward(q, k_cmp, v_cmp, o, lse)
        ctx.mark_non_differentiable(lse, indices)
        ctx.band = functools.partial(_compressed_band, k_cmp.shape[1], cfg.l, cfg.d)
        ctx.scale, ctx.query_chunk = scale, query_chunk
        return o, lse, indices

    @staticmethod
    def backward(ctx, do: torch.Tensor, _dlse, _dindices):
        q, k_cmp, v_cmp, o, lse = ctx.saved_tensors
        dq, dk, dv = dense_backward(q, k_cmp, v_cmp, o, lse, do, ctx.band, ctx.scale,
                                    ctx.query_chunk)
        return dq, dk, dv, None, None, None


def compressed_attention_and_selection(q: torch.Tensor, k_cmp: torch.Tensor,
                                       v_cmp: torch.Tensor, cfg: NSAConfig,
                                       scale: float | None = None, query_chunk: int = 128,
                                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, block indices [B, S, Hkv, n_sel] int64) of the
    compressed branch with compression cfg.l / cfg.d and the selection of cfg.l_sel /
    cfg.n_sel blocks; lse and indices are non-differentiable. See the module docstring."""
    check_layout(q, k_cmp, v_cmp)
    return _CompressedWithSelection.apply(q, k_cmp, v_cmp, cfg,
                                          resolve_scale(q.shape[-1], scale),
                                          check_chunk(query_chunk))
