"""Sliding-window attention, memory-bounded (flash-style) torch implementation.

Layout: q [B, S, Hq, D]; k, v [B, S, Hkv, D]; query head h reads kv head h // G, G = Hq // Hkv.
Query t attends keys s with t - window < s <= t (the window includes t itself, so
window = 1 sees only the diagonal, and window >= S is plain causal attention).

Queries are processed in tiles; tile [t0, t1) reads the contiguous key slice
[t0 - window + 1, t1) and masks the band, so forward time and temporaries are
O(S * (query_chunk + window)). Backward saves only q, k, v, the output and the fp32
log-sum-exp [B, S, Hq] and recomputes the probabilities tile by tile.
Compute is fp32; outputs and gradients come back in the input dtype.

On the CPU the tiles are small (min(`_CPU_TILE`, query_chunk) queries, so that little of
each key slice lies outside the band) and go to aten's fused flash kernel as one batch per
call, as many as keep the call's per-tile dK/dV partials within `_CALL_FLOATS`. Keys and
values are padded in front by window - 1 zero rows, after which every tile's key slice is a
strided view of the same buffer (never copied) and every tile but the first few shares one
band mask; those first tiles also mask the padding. The kernel's per-tile dK/dV are added
back onto the overlapping slices in a fixed order.
Elsewhere each `query_chunk` tile is one masked dense problem (`_tiles.DenseBandAttention`).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from nsa.ops.torch._tiles import (
    _CPU_FLASH,
    _CPU_FLASH_BACKWARD,
    DenseBandAttention,
    check_chunk,
    check_layout,
    resolve_scale,
    use_fused_kernel,
)
from nsa.ops.workspace import Workspace

__all__ = ["window_attention", "window_attention_with_lse"]


def _window_band(window: int, t0: int, t1: int,
                 device: torch.device) -> tuple[int, int, int, torch.Tensor]:
    k0 = max(0, t0 - window + 1)
    t = torch.arange(t0, t1, device=device).unsqueeze(1)
    s = torch.arange(k0, t1, device=device).unsqueeze(0)
    return k0, k0, t1, (s > t) | (s <= t - window)


_CPU_TILE = 64
_CALL_FLOATS = 1 << 21  # fp32 elements of one call's per-tile dK (and of its dV): 8 MiB


class _CpuLayout:
    """Padded fp32 buffers and tile geometry of the CPU path for one call.

    T queries per tile, tile i holds queries [i*T, (i+1)*T) and reads the padded keys
    [i*T, i*T + K), K = T + window - 1, i.e. raw keys [i*T - window + 1, (i+1)*T). Query
    row r of a tile (G heads of a group per query, row = query*G + head) sees padded key c
    iff r // G <= c <= r // G + window - 1."""

    def __init__(self, q: torch.Tensor, n_kv_heads: int, window: int, query_chunk: int):
        self.batch, self.seq, self.n_q_heads, self.head_dim = q.shape
        self.n_kv_heads, self.window = n_kv_heads, window
        self.group = self.n_q_heads // n_kv_heads
        self.tile = min(_CPU_TILE, query_chunk)
        self.n_tiles = -(-self.seq // self.tile)
        self.n_keys = self.tile + window - 1
        self.per_call = max(1, _CALL_FLOATS // (n_kv_heads * self.n_keys * self.head_dim))
        # tiles whose slice starts before raw key 0 mask the padding too
        self.n_first = min(self.n_tiles, -(-(window - 1) // self.tile))
        self.device = q.device

    def pad_queries(self, x: torch.Tensor) -> torch.Tensor:
        """[B, S, Hq, ...] -> fp32 [B, n_tiles*T, Hq, ...] (zero rows after S); x itself
        when it is fp32 already and S is whole tiles (read only)."""
        pad = self.n_tiles * self.tile - self.seq
        return F.pad(x.float(), (0, 0) * (x.dim() - 2) + (0, pad)) if pad else x.float()

    def pad_keys(self, x: torch.Tensor) -> torch.Tensor:
        """[B, S, Hkv, D] -> fp32 [B, (n_tiles + J)*T, Hkv, D], window - 1 zero rows in
        front and zeros after S; J = ceil(K / T) whole tiles cover every slice."""
        length = (self.n_tiles + self.slices_per_tile()) * self.tile
        return F.pad(x.float(), (0, 0, 0, 0, self.window - 1,
                                 length - self.window + 1 - self.seq))

    def slices_per_tile(self) -> int:
        return -(-self.n_keys // self.tile)

    def calls(self) -> list[tuple[int, int]]:
        """Tile ranges of one kernel call each, at most `per_call` tiles; the first tiles
        (own masks) never share a call with the others (one shared mask)."""
        edges = sorted({0, self.n_first, self.n_tiles})
        return [(i, min(i + self.per_call, hi)) for lo, hi in zip(edges, edges[1:], strict=False)
                for i in range(lo, hi, self.per_call)]

    def rows(self, x_pad: torch.Tensor, b: int, i0: int, i1: int, ws: Workspace,
             name: str) -> torch.Tensor:
        """Queries of tiles [i0, i1) of batch b: [B, S_pad, Hq, X] -> [n, Hkv, T*G, X], in
        workspace buffer `name`."""
        n, tile = i1 - i0, self.tile
        part = x_pad[b, i0 * tile:i1 * tile].view(n, tile, self.n_kv_heads, self.group, -1)
        out = ws.take(name, n, self.n_kv_heads, tile, self.group, part.shape[-1])
        out.copy_(part.permute(0, 2, 1, 3, 4))
        return out.view(n, self.n_kv_heads, tile * self.group, -1)

    def unrows(self, x: torch.Tensor, out_pad: torch.Tensor, b: int, i0: int) -> None:
        """Write [n, Hkv, T*G, X] rows into out_pad [B, S_pad, Hq, X] at tile i0."""
        n, tile = x.shape[0], self.tile
        view = out_pad[b, i0 * tile:(i0 + n) * tile].view(n, tile, self.n_kv_heads,
                                                           self.group, -1)
        view.copy_(x.view(n, self.n_kv_heads, tile, self.group, -1).permute(0, 2, 1, 3, 4))

    def key_slices(self, kv_pad: torch.Tensor, b: int, i0: int, i1: int) -> torch.Tensor:
        """The key slices of tiles [i0, i1): a view [n, Hkv, K, D] of kv_pad[b]."""
        base = kv_pad[b, i0 * self.tile:]
        step, head, row = base.stride(0) * self.tile, base.stride(1), base.stride(0)
        return base.as_strided((i1 - i0, self.n_kv_heads, self.n_keys, self.head_dim),
                               (step, head, row, 1))

    def bias(self, i0: int, i1: int) -> torch.Tensor:
        """Additive mask [n or 1, 1, T*G, K]: the band, and the padding for first tiles."""
        row = torch.arange(self.tile * self.group, device=self.device).view(-1, 1) // self.group
        col = torch.arange(self.n_keys, device=self.device).view(1, -1)
        hidden = ((col < row) | (col > row + self.window - 1)).unsqueeze(0)
        if i0 < self.n_first:
            first_real = self.window - 1 - torch.arange(i0, i1, device=self.device) * self.tile
            hidden = hidden | (col.unsqueeze(0) < first_real.view(-1, 1, 1))
        bias = torch.zeros(hidden.shape, dtype=torch.float32, device=self.device)
        return bias.masked_fill_(hidden, -math.inf).unsqueeze(1)


class _CpuWindowAttention(torch.autograd.Function):
    """(o, lse) of sliding-window attention on the CPU; see the module docstring."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                scale: float, query_chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        lay = _CpuLayout(q, k.shape[2], window, query_chunk)
        q_pad, k_pad, v_pad = lay.pad_queries(q), lay.pad_keys(k), lay.pad_keys(v)
        o_pad = torch.empty_like(q_pad)
        lse_pad = q_pad.new_empty(q_pad.shape[:3] + (1,))
        ws = Workspace(q.device)
        for b in range(lay.batch):
            for i0, i1 in lay.calls():
                bias = lay.bias(i0, i1)
                ot, lt = _CPU_FLASH(lay.rows(q_pad, b, i0, i1, ws, "q"),
                                    lay.key_slices(k_pad, b, i0, i1),
                                    lay.key_slices(v_pad, b, i0, i1), 0.0, False,
                                    attn_mask=bias.expand(i1 - i0, lay.n_kv_heads, -1, -1),
                                    scale=scale)
                lay.unrows(ot, o_pad, b, i0)
                lay.unrows(lt.unsqueeze(-1), lse_pad, b, i0)
        o = _trimmed(o_pad, lay.seq).to(q.dtype)
        lse = lse_pad[:, :lay.seq, :, 0]  # every query sees itself: never empty
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mark_non_differentiable(lse)
        ctx.config = (window, scale, query_chunk)
        return o, lse

    @staticmethod
    def backward(ctx, do: torch.Tensor, _dlse: torch.Tensor | None):
        q, k, v, o, lse = ctx.saved_tensors
        window, scale, query_chunk = ctx.config
        lay = _CpuLayout(q, k.shape[2], window, query_chunk)
        q_pad, k_pad, v_pad = lay.pad_queries(q), lay.pad_keys(k), lay.pad_keys(v)
        # padded queries: dO = 0 and o = lse = 0, so they add nothing to dK/dV
        do_pad, o_pad = lay.pad_queries(do), lay.pad_queries(o)
        lse_pad = lay.pad_queries(lse.unsqueeze(-1))
        dq_pad = torch.empty_like(q_pad)
        dk_pad, dv_pad = torch.zeros_like(k_pad), torch.zeros_like(v_pad)
        ws = Workspace(q.device)
        for b in range(lay.batch):
            for i0, i1 in lay.calls():
                bias = lay.bias(i0, i1).expand(i1 - i0, lay.n_kv_heads, -1, -1)
                lse_rows = lay.rows(lse_pad, b, i0, i1, ws, "lse").squeeze(-1)
                dq, dk, dv = _CPU_FLASH_BACKWARD(
                    lay.rows(do_pad, b, i0, i1, ws, "do"), lay.rows(q_pad, b, i0, i1, ws, "q"),
                    lay.key_slices(k_pad, b, i0, i1), lay.key_slices(v_pad, b, i0, i1),
                    lay.rows(o_pad, b, i0, i1, ws, "o"), lse_rows, 0.0, False,
                    attn_mask=bias, scale=scale)
                lay.unrows(dq, dq_pad, b, i0)
                _add_slices(dk, dk_pad[b], i0, lay.tile)
                _add_slices(dv, dv_pad[b], i0, lay.tile)
        start = window - 1
        return (_trimmed(dq_pad, lay.seq).to(q.dtype), dk_pad[:, start:start + lay.seq].to(k.dtype),
                dv_pad[:, start:start + lay.seq].to(v.dtype), None, None, None)


def _trimmed(x_pad: torch.Tensor, seq: int) -> torch.Tensor:
    """x_pad[:, :seq], as x_pad itself when nothing is trimmed: autograd adds a gradient
    arriving later into a tensor that is not a view in place, instead of into a new one."""
    return x_pad if x_pad.shape[1] == seq else x_pad[:, :seq]


def _add_slices(parts: torch.Tensor, keys_pad: torch.Tensor, i0: int, tile: int) -> None:
    """Add per-tile key gradients parts [n, Hkv, K, D] of tiles i0.. onto their slices of
    keys_pad [L, Hkv, D], T rows at a time (a fixed order: deterministic)."""
    n, _, n_keys, _ = parts.shape
    whole = keys_pad.view(-1, tile, *keys_pad.shape[1:])  # [L / T, T, Hkv, D]
    for j, c0 in enumerate(range(0, n_keys, tile)):
        width = min(tile, n_keys - c0)
        whole[i0 + j:i0 + j + n, :width] += parts[:, :, c0:c0 + width].transpose(1, 2)


def window_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                              scale: float | None = None,
                              query_chunk: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, non-differentiable) of sliding-window attention."""
    check_layout(q, k, v)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k: must have the query length {q.shape[1]}, got {k.shape[1]}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window: must be a positive integer, got {window!r}")
    scale, query_chunk = resolve_scale(q.shape[-1], scale), check_chunk(query_chunk)
    if use_fused_kernel(q.device):
        return _CpuWindowAttention.apply(q, k, v, window, scale, query_chunk)
    band = functools.partial(_window_band, window)
    return DenseBandAttention.apply(q, k, v, band, scale, query_chunk)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                     scale: float | None = None, query_chunk: int = 128) -> torch.Tensor:
    """o [B, S, Hq, D] of sliding-window attention; see the module docstring."""
    return window_attention_with_lse(q, k, v, window, scale, query_chunk)[0]
