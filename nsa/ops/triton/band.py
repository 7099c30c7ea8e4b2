"""Sliding-window and compressed attention in Triton: one flash kernel over a key band.

Same contracts as `nsa.ops.torch.window_attention_with_lse` and `compressed_attention`:
q [B, S, Hq, D], keys/values [B, N, Hkv, D], query head h reads kv head h // G.
  window      N = S; query t sees keys s with t - window < s <= t.
  compressed  key i summarises raw keys [i*stride, i*stride + length) and is visible to
              query t iff i*stride + length - 1 <= t.
Both are a band: a tile of queries [t0, t1) needs only keys [lo, hi) computed from the tile's
ends, so work is O(S * band) and nothing of size S x N exists. A query that sees no key gets
o = 0 and lse = -inf (fp32 [B, S, Hq], units of scale * q.k) and zero gradients.

Forward and dQ run one program per (query tile, batch x query head) with an online softmax
over key tiles; dK/dV run one program per (key tile, batch x kv head) that loops over the G
heads of its group and the query tiles that can see it — no atomics, a fixed summation order,
so gradients are identical between runs. All offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops.triton._common import check_shapes, dot_precision, launch_options
from nsa.ops.triton._tiles import (
    finish_softmax,
    load_pair,
    load_stats,
    online_softmax_step,
    probs_and_score_grads,
    tile_offsets,
)

__all__ = ["compressed_attention", "window_attention_with_lse"]

QUERY_TILE = 64
KEY_TILE = 64
WINDOW, COMPRESSED = 0, 1


@triton.jit
def _visible(t, s, band_a, band_b, MODE: tl.constexpr):
    """[T, K] bool: query positions t [T] see keys s [K] (band_a, band_b = window, 0 or
    length, stride)."""
    if MODE == 0:
        return (s[None, :] <= t[:, None]) & (s[None, :] > t[:, None] - band_a)
    else:
        return s[None, :] * band_b + band_a - 1 <= t[:, None]


@triton.jit
def _key_range(t0, t1, n_keys, band_a, band_b, MODE: tl.constexpr):
    """Keys [lo, hi) that queries [t0, t1) can see."""
    if MODE == 0:
        lo = tl.maximum(t0 - band_a + 1, 0)
        hi = tl.minimum(t1, n_keys)
    else:
        lo = t0 * 0
        # i*stride + length - 1 <= t1 - 1  <=>  i <= (t1 - length) / stride
        hi = tl.where(t1 >= band_a, (t1 - band_a) // band_b + 1, 0)
        hi = tl.minimum(hi, n_keys)
    return lo, hi


@triton.jit
def _query_range(s0, s1, seq_len, band_a, band_b, MODE: tl.constexpr):
    """Queries [lo, hi) that can see some key of [s0, s1)."""
    if MODE == 0:
        lo = s0
        hi = tl.minimum(s1 - 1 + band_a, seq_len)
    else:
        lo = s0 * band_b + band_a - 1
        hi = seq_len + s0 * 0
    return lo, hi


@triton.jit
def _band_fwd(Q, K, V, O, LSE,
              stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
              stride_lb, stride_ls,
              seq_len, n_keys, n_q_heads, group, band_a, band_b, scale,
              MODE: tl.constexpr, HEAD_DIM: tl.constexpr, QUERY_TILE: tl.constexpr,
              KEY_TILE: tl.constexpr, PRECISION: tl.constexpr):
    t0 = tl.program_id(0).to(tl.int64) * QUERY_TILE
    bh = tl.program_id(1).to(tl.int64)
    b, hq = bh // n_q_heads, bh % n_q_heads
    hk = hq // group
    t = t0 + tl.arange(0, QUERY_TILE)
    cols = tl.arange(0, HEAD_DIM)
    t_ok = t < seq_len
    q_offsets = tile_offsets(b, t, hq, stride_qb, stride_qs, stride_qh, cols)
    q = tl.load(Q + q_offsets, mask=t_ok[:, None], other=0.0)
    m = tl.full([QUERY_TILE], float("-inf"), tl.float32)
    denom = tl.zeros([QUERY_TILE], tl.float32)
    acc = tl.zeros([QUERY_TILE, HEAD_DIM], tl.float32)
    lo, hi = _key_range(t0, tl.minimum(t0 + QUERY_TILE, seq_len), n_keys, band_a, band_b, MODE)
    for s0 in range(lo, hi, KEY_TILE):
        s = s0 + tl.arange(0, KEY_TILE)
        s_ok = s < hi
        k, v = load_pair(K, V, tile_offsets(b, s, hk, stride_kb, stride_ks, stride_kh, cols),
                         s_ok)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        allowed = s_ok[None, :] & _visible(t, s, band_a, band_b, MODE)
        scores = tl.where(allowed, scores, float("-inf"))
        m, denom, acc = online_softmax_step(scores, v, m, denom, acc, PRECISION)
    o, lse = finish_softmax(m, denom, acc)
    tl.store(O + q_offsets, o.to(O.dtype.element_ty), mask=t_ok[:, None])
    tl.store(LSE + b * stride_lb + t * stride_ls + hq, lse, mask=t_ok)


@triton.jit
def _band_dq(Q, K, V, DO, LSE, DELTA, DQ,
             stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
             stride_lb, stride_ls,
             seq_len, n_keys, n_q_heads, group, band_a, band_b, scale,
             MODE: tl.constexpr, HEAD_DIM: tl.constexpr, QUERY_TILE: tl.constexpr,
             KEY_TILE: tl.constexpr, PRECISION: tl.constexpr):
    t0 = tl.program_id(0).to(tl.int64) * QUERY_TILE
    bh = tl.program_id(1).to(tl.int64)
    b, hq = bh // n_q_heads, bh % n_q_heads
    hk = hq // group
    t = t0 + tl.arange(0, QUERY_TILE)
    cols = tl.arange(0, HEAD_DIM)
    t_ok = t < seq_len
    q_offsets = tile_offsets(b, t, hq, stride_qb, stride_qs, stride_qh, cols)
    q, do = load_pair(Q, DO, q_offsets, t_ok)
    lse, delta = load_stats(LSE, DELTA, b * stride_lb + t * stride_ls + hq, t_ok)
    dq = tl.zeros([QUERY_TILE, HEAD_DIM], tl.float32)
    lo, hi = _key_range(t0, tl.minimum(t0 + QUERY_TILE, seq_len), n_keys, band_a, band_b, MODE)
    for s0 in range(lo, hi, KEY_TILE):
        s = s0 + tl.arange(0, KEY_TILE)
        s_ok = s < hi
        k, v = load_pair(K, V, tile_offsets(b, s, hk, stride_kb, stride_ks, stride_kh, cols),
                         s_ok)
        allowed = t_ok[:, None] & s_ok[None, :] & _visible(t, s, band_a, band_b, MODE)
        _, ds = probs_and_score_grads(q, k, v, do, lse, delta, allowed, scale, PRECISION)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + q_offsets, (dq * scale).to(DQ.dtype.element_ty), mask=t_ok[:, None])


@triton.jit
def _band_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
               stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
               stride_lb, stride_ls, stride_part,
               seq_len, n_keys, n_kv_heads, group, band_a, band_b, scale,
               MODE: tl.constexpr, HEAD_DIM: tl.constexpr, QUERY_TILE: tl.constexpr,
               KEY_TILE: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr):
    s0 = tl.program_id(0).to(tl.int64) * KEY_TILE
    bh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)
    b, hk = bh // n_kv_heads, bh % n_kv_heads
    s = s0 + tl.arange(0, KEY_TILE)
    cols = tl.arange(0, HEAD_DIM)
    s_ok = s < n_keys
    kv_offsets = tile_offsets(b, s, hk, stride_kb, stride_ks, stride_kh, cols)
    k, v = load_pair(K, V, kv_offsets, s_ok)
    dk = tl.zeros([KEY_TILE, HEAD_DIM], tl.float32)
    dv = tl.zeros([KEY_TILE, HEAD_DIM], tl.float32)
    lo, hi = _query_range(s0, tl.minimum(s0 + KEY_TILE, n_keys), seq_len, band_a, band_b, MODE)
    # this program's share of the queries, in whole query tiles
    share = tl.cdiv(tl.cdiv(tl.maximum(hi - lo, 0), SPLITS), QUERY_TILE) * QUERY_TILE
    lo = lo + split * share
    hi = tl.minimum(hi, lo + share)
    for g in range(group):
        hq = hk * group + g
        for t0 in range(lo, hi, QUERY_TILE):
            t = t0 + tl.arange(0, QUERY_TILE)
            t_ok = t < hi
            q, do = load_pair(Q, DO, tile_offsets(b, t, hq, stride_qb, stride_qs, stride_qh,
                                                  cols), t_ok)
            lse, delta = load_stats(LSE, DELTA, b * stride_lb + t * stride_ls + hq, t_ok)
            allowed = t_ok[:, None] & s_ok[None, :] & _visible(t, s, band_a, band_b, MODE)
            p, ds = probs_and_score_grads(q, k, v, do, lse, delta, allowed, scale, PRECISION)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    # one slot per split (fp32 partials summed in split order afterwards) or, unsplit, dK/dV
    part = split * stride_part + kv_offsets
    tl.store(DK + part, (dk * scale).to(DK.dtype.element_ty), mask=s_ok[:, None])
    tl.store(DV + part, dv.to(DV.dtype.element_ty), mask=s_ok[:, None])


def key_splits(mode: int, seq: int, n_keys: int, batch_heads: int) -> int:
    """How many programs share the queries of one key tile in dK/dV: compressed keys are
    seen by every later query, so with few key tiles the work is split (about a thousand
    programs in all, at least four query tiles each); the window's band is short."""
    if mode == WINDOW:
        return 1
    programs = triton.cdiv(n_keys, KEY_TILE) * batch_heads
    splits = 1
    while (splits * 2 * programs <= 1024 and splits * 2 * 4 * QUERY_TILE <= seq
           and splits < 32):
        splits *= 2
    return splits


def _launch_args(q, k, lse):
    return (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            lse.stride(0), lse.stride(1), q.shape[1], k.shape[1])


class _BandAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, band, scale):
        check_shapes(q, k, v)
        mode, band_a, band_b = band
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        batch, seq, n_q_heads, head_dim = q.shape
        group = n_q_heads // k.shape[2]
        o = torch.empty_like(q)
        lse = torch.empty(batch, seq, n_q_heads, device=q.device, dtype=torch.float32)
        grid = (triton.cdiv(seq, QUERY_TILE), batch * n_q_heads)
        _band_fwd[grid](q, k, v, o, lse, *_launch_args(q, k, lse), n_q_heads, group,
                        band_a, band_b, scale, MODE=mode, HEAD_DIM=head_dim,
                        QUERY_TILE=QUERY_TILE, KEY_TILE=KEY_TILE, PRECISION=dot_precision(q),
                        **launch_options(q.dtype, QUERY_TILE * head_dim))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.band, ctx.scale = band, scale
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        mode, band_a, band_b = ctx.band
        batch, seq, n_q_heads, head_dim = q.shape
        n_kv_heads = k.shape[2]
        group = n_q_heads // n_kv_heads
        do = do.contiguous()
        delta = (o.float() * do.float()).sum(-1)
        constants = dict(MODE=mode, HEAD_DIM=head_dim, QUERY_TILE=QUERY_TILE, KEY_TILE=KEY_TILE,
                         PRECISION=dot_precision(q),
                         **launch_options(q.dtype, QUERY_TILE * head_dim))
        dq = torch.empty_like(q)
        _band_dq[(triton.cdiv(seq, QUERY_TILE), batch * n_q_heads)](
            q, k, v, do, lse, delta, dq, *_launch_args(q, k, lse), n_q_heads, group,
            band_a, band_b, ctx.scale, **constants)
        splits = key_splits(mode, seq, k.shape[1], batch * n_kv_heads)
        if splits == 1:
            dk, dv = torch.empty_like(k), torch.empty_like(v)
        else:  # fp32 partials, one per split, summed in a fixed order: still deterministic
            dk = torch.empty(splits, *k.shape, device=k.device, dtype=torch.float32)
            dv = torch.empty_like(dk)
        if k.shape[1] > 0:
            _band_dkdv[(triton.cdiv(k.shape[1], KEY_TILE), batch * n_kv_heads, splits)](
                q, k, v, do, lse, delta, dk, dv, *_launch_args(q, k, lse)[:8],
                k.numel(), *_launch_args(q, k, lse)[8:], n_kv_heads, group, band_a, band_b,
                ctx.scale, SPLITS=splits, **constants)
        if splits > 1:
            dk, dv = dk.sum(0).to(k.dtype), dv.sum(0).to(v.dtype)
        return dq, dk, dv, None, None


def window_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, non-differentiable) of sliding-window attention."""
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k: must have the query length {q.shape[1]}, got {k.shape[1]}")
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window: must be a positive integer, got {window!r}")
    return _BandAttention.apply(q, k, v, (WINDOW, window, 0), float(scale))


def compressed_attention(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor,
                         block_len: int, stride: int,
                         scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, non-differentiable) over compressed tokens."""
    for name, value in (("block_len", block_len), ("stride", stride)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    return _BandAttention.apply(q, k_cmp, v_cmp, (COMPRESSED, block_len, stride), float(scale))
