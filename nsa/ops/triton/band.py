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
over key tiles, the tiles with the most keys first; dK/dV run one program per (key tile,
batch x kv head) that loops over the G heads of its group and the query tiles that can see
it. A compressed key is seen by every later query, so there the queries are cut at multiples
of `ITEM_QUERIES` into work items, each writing an fp32 partial that a second kernel sums in
item order. No atomics, a fixed summation order: gradients are identical between
runs. Only tiles that hold a (query, key) pair outside the band evaluate the band's
positions; the others run without a mask. Softmax exponentials are base 2 with the scale
folded into one multiply. All offsets are int64.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nsa.ops.triton._common import check_shapes, dot_precision, launch_options
from nsa.ops.triton._tiles import load_pair, online_softmax_step, row_dot, tile_offsets

__all__ = ["band_backward", "compressed_attention", "window_attention_with_lse"]

QUERY_TILE = 64
KEY_TILE = 64
ITEM_QUERIES = 4096
"""Queries of one compressed key tile's dK/dV work item (a multiple of QUERY_TILE)."""
WINDOW, COMPRESSED = 0, 1
LOG2E = math.log2(math.e)


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
    """(lo, hi, full_lo, full_hi): keys [lo, hi) that some query of [t0, t1) sees, and keys
    [full_lo, full_hi) that every one of them sees."""
    if MODE == 0:
        lo = tl.maximum(t0 - band_a + 1, 0)
        hi = tl.minimum(t1, n_keys)
        full_lo = tl.maximum(t1 - band_a, 0)
        full_hi = tl.minimum(t0 + 1, n_keys)
    else:
        lo = t0 * 0
        # i*stride + length - 1 <= t  <=>  i <= (t - length + 1) / stride
        hi = tl.minimum(tl.where(t1 >= band_a, (t1 - band_a) // band_b + 1, 0), n_keys)
        full_lo = lo
        full_hi = tl.minimum(tl.where(t0 >= band_a - 1, (t0 - band_a + 1) // band_b + 1, 0),
                             n_keys)
    return lo, hi, full_lo, full_hi


@triton.jit
def _query_range(s0, s1, seq_len, band_a, band_b, MODE: tl.constexpr):
    """(lo, hi, full_lo, full_hi): queries [lo, hi) that see some key of [s0, s1), and
    queries [full_lo, full_hi) that see every one of them."""
    if MODE == 0:
        lo = s0
        hi = tl.minimum(s1 - 1 + band_a, seq_len)
        full_lo = s1 - 1
        full_hi = tl.minimum(s0 + band_a, seq_len)
    else:
        lo = s0 * band_b + band_a - 1
        hi = seq_len + s0 * 0
        full_lo = (s1 - 1) * band_b + band_a - 1
        full_hi = hi
    return lo, hi, full_lo, full_hi


@triton.jit
def _unmasked_span(lo, hi, full_lo, full_hi, STEP: tl.constexpr):
    """(a, b): tiles of STEP starting at lo, lo + STEP, ... that lie inside [full_lo, full_hi)
    are exactly those starting in [a, b); tiles in [lo, a) and [b, hi) need a mask."""
    a = tl.minimum(lo + tl.cdiv(tl.maximum(full_lo - lo, 0), STEP) * STEP, hi)
    b = a + tl.maximum(tl.minimum(full_hi, hi) - a, 0) // STEP * STEP
    return a, b


@triton.jit
def _fwd_tile(q, K, V, kv_offsets, t, s, s_ok, m, denom, acc, scale_log2, band_a, band_b,
              MASKED: tl.constexpr, MODE: tl.constexpr, PRECISION: tl.constexpr):
    """One key tile of the online softmax in base 2 (a row that has seen no key keeps
    m = -inf and is shifted by 0, so nothing becomes NaN)."""
    if MASKED:
        k, v = load_pair(K, V, kv_offsets, s_ok)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        allowed = s_ok[None, :] & _visible(t, s, band_a, band_b, MODE)
        scores = tl.where(allowed, scores, float("-inf"))
    else:
        k, v = tl.load(K + kv_offsets), tl.load(V + kv_offsets)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    return online_softmax_step(scores, v, m, denom, acc, PRECISION, True)


@triton.jit
def _band_fwd(Q, K, V, O, LSE,
              stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
              stride_lb, stride_ls,
              seq_len, n_keys, n_q_heads, group, band_a, band_b, scale_log2,
              MODE: tl.constexpr, HEAD_DIM: tl.constexpr, QUERY_TILE: tl.constexpr,
              KEY_TILE: tl.constexpr, PRECISION: tl.constexpr):
    t0 = (tl.num_programs(0) - 1 - tl.program_id(0)).to(tl.int64) * QUERY_TILE
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
    lo, hi, full_lo, full_hi = _key_range(t0, tl.minimum(t0 + QUERY_TILE, seq_len), n_keys,
                                          band_a, band_b, MODE)
    a, z = _unmasked_span(lo, hi, full_lo, full_hi, KEY_TILE)
    for s0 in range(lo, a, KEY_TILE):
        s = s0 + tl.arange(0, KEY_TILE)
        m, denom, acc = _fwd_tile(q, K, V, tile_offsets(b, s, hk, stride_kb, stride_ks,
                                                        stride_kh, cols),
                                  t, s, s < hi, m, denom, acc, scale_log2, band_a, band_b,
                                  True, MODE, PRECISION)
    for s0 in range(a, z, KEY_TILE):
        s = s0 + tl.arange(0, KEY_TILE)
        m, denom, acc = _fwd_tile(q, K, V, tile_offsets(b, s, hk, stride_kb, stride_ks,
                                                        stride_kh, cols),
                                  t, s, s < hi, m, denom, acc, scale_log2, band_a, band_b,
                                  False, MODE, PRECISION)
    for s0 in range(z, hi, KEY_TILE):
        s = s0 + tl.arange(0, KEY_TILE)
        m, denom, acc = _fwd_tile(q, K, V, tile_offsets(b, s, hk, stride_kb, stride_ks,
                                                        stride_kh, cols),
                                  t, s, s < hi, m, denom, acc, scale_log2, band_a, band_b,
                                  True, MODE, PRECISION)
    seen = denom > 0
    safe = tl.where(seen, denom, 1.0)
    o = tl.where(seen[:, None], acc / safe[:, None], 0.0)
    lse = tl.where(seen, (m + tl.log2(safe)) * 0.6931471805599453, float("-inf"))
    tl.store(O + q_offsets, o.to(O.dtype.element_ty), mask=t_ok[:, None])
    tl.store(LSE + b * stride_lb + t * stride_ls + hq, lse, mask=t_ok)


@triton.jit
def _stats(LSE, DELTA, offsets, ok):
    """(lse in base-2 units, delta) of the rows at `offsets`; lse = -inf reads as 0 (such a
    row has no allowed key, so its probabilities are masked to 0 anyway)."""
    lse = tl.load(LSE + offsets, mask=ok, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse) * 1.4426950408889634
    return lse, tl.load(DELTA + offsets, mask=ok, other=0.0)


@triton.jit
def _grads_tile(q, k, v, do, lse2, delta, t, s, t_ok, s_ok, scale_log2, band_a, band_b,
                MASKED: tl.constexpr, MODE: tl.constexpr, PRECISION: tl.constexpr):
    """(p, ds) [T, K]: p = exp2(scale_log2 q.k - lse2) (0 outside the band when MASKED) and
    ds = p * (do.v - delta)."""
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    if MASKED:
        allowed = t_ok[:, None] & s_ok[None, :] & _visible(t, s, band_a, band_b, MODE)
        p = tl.where(allowed, tl.exp2(scores - lse2[:, None]), 0.0)
    else:
        p = tl.exp2(scores - lse2[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    return p, p * (dp - delta[:, None])


@triton.jit
def _dq_tile(q, do, lse2, delta, K, V, kv_offsets, t, s, t_ok, s_ok, dq, scale_log2, band_a,
             band_b, MASKED: tl.constexpr, MODE: tl.constexpr, PRECISION: tl.constexpr):
    if MASKED:
        k, v = load_pair(K, V, kv_offsets, s_ok)
    else:
        k, v = tl.load(K + kv_offsets), tl.load(V + kv_offsets)
    _, ds = _grads_tile(q, k, v, do, lse2, delta, t, s, t_ok, s_ok, scale_log2, band_a,
                        band_b, MASKED, MODE, PRECISION)
    return dq + tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)


@triton.jit
def _band_dq(Q, K, V, DO, LSE, DELTA, DQ,
             stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
             stride_lb, stride_ls,
             seq_len, n_keys, n_q_heads, group, band_a, band_b, scale, scale_log2,
             MODE: tl.constexpr, HEAD_DIM: tl.constexpr, QUERY_TILE: tl.constexpr,
             KEY_TILE: tl.constexpr, PRECISION: tl.constexpr):
    t0 = (tl.num_programs(0) - 1 - tl.program_id(0)).to(tl.int64) * QUERY_TILE
    bh = tl.program_id(1).to(tl.int64)
    b, hq = bh // n_q_heads, bh % n_q_heads
    hk = hq // group
    t = t0 + tl.arange(0, QUERY_TILE)
    cols = tl.arange(0, HEAD_DIM)
    t_ok = t < seq_len
    q_offsets = tile_offsets(b, t, hq, stride_qb, stride_qs, stride_qh, cols)
    q, do = load_pair(Q, DO, q_offsets, t_ok)
    lse2, delta = _stats(LSE, DELTA, b * stride_lb + t * stride_ls + hq, t_ok)
    dq = tl.zeros([QUERY_TILE, HEAD_DIM], tl.float32)
    lo, hi, full_lo, full_hi = _key_range(t0, tl.minimum(t0 + QUERY_TILE, seq_len), n_keys,
                                          band_a, band_b, MODE)
    a, z = _unmasked_span(lo, hi, full_lo, full_hi, KEY_TILE)
    for s0 in range(lo, a, KEY_TILE):
        s = s0 + tl.arange(0, KEY_TILE)
        dq = _dq_tile(q, do, lse2, delta, K, V,
                      tile_offsets(b, s, hk, stride_kb, stride_ks, stride_kh, cols),
                      t, s, t_ok, s < hi, dq, scale_log2, band_a, band_b, True, MODE, PRECISION)
    for s0 in range(a, z, KEY_TILE):
        s = s0 + tl.arange(0, KEY_TILE)
        dq = _dq_tile(q, do, lse2, delta, K, V,
                      tile_offsets(b, s, hk, stride_kb, stride_ks, stride_kh, cols),
                      t, s, t_ok, s < hi, dq, scale_log2, band_a, band_b, False, MODE,
                      PRECISION)
    for s0 in range(z, hi, KEY_TILE):
        s = s0 + tl.arange(0, KEY_TILE)
        dq = _dq_tile(q, do, lse2, delta, K, V,
                      tile_offsets(b, s, hk, stride_kb, stride_ks, stride_kh, cols),
                      t, s, t_ok, s < hi, dq, scale_log2, band_a, band_b, True, MODE, PRECISION)
    tl.store(DQ + q_offsets, (dq * scale).to(DQ.dtype.element_ty), mask=t_ok[:, None])


@triton.jit
def _dkdv_tile(Q, DO, LSE, DELTA, k, v, dk, dv, b, hq, t0, hi, s, s_ok,
               stride_qb, stride_qs, stride_qh, stride_lb, stride_ls, cols, scale_log2,
               band_a, band_b, MASKED: tl.constexpr, MODE: tl.constexpr,
               QUERY_TILE: tl.constexpr, PRECISION: tl.constexpr):
    t = t0 + tl.arange(0, QUERY_TILE)
    t_ok = t < hi
    offsets = tile_offsets(b, t, hq, stride_qb, stride_qs, stride_qh, cols)
    if MASKED:
        q, do = load_pair(Q, DO, offsets, t_ok)
    else:
        q, do = tl.load(Q + offsets), tl.load(DO + offsets)
    lse2, delta = _stats(LSE, DELTA, b * stride_lb + t * stride_ls + hq, t_ok)
    p, ds = _grads_tile(q, k, v, do, lse2, delta, t, s, t_ok, s_ok, scale_log2, band_a,
                        band_b, MASKED, MODE, PRECISION)
    dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
    dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _band_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
               stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
               stride_lb, stride_ls, stride_item,
               seq_len, n_keys, n_kv_heads, group, band_a, band_b, scale, scale_log2,
               MODE: tl.constexpr, HEAD_DIM: tl.constexpr, QUERY_TILE: tl.constexpr,
               KEY_TILE: tl.constexpr, ITEM_QUERIES: tl.constexpr, PARTIAL: tl.constexpr,
               PRECISION: tl.constexpr):
    s0 = tl.program_id(0).to(tl.int64) * KEY_TILE
    bh = tl.program_id(1).to(tl.int64)
    item = tl.program_id(2).to(tl.int64)
    b, hk = bh // n_kv_heads, bh % n_kv_heads
    s = s0 + tl.arange(0, KEY_TILE)
    cols = tl.arange(0, HEAD_DIM)
    s_ok = s < n_keys
    kv_offsets = tile_offsets(b, s, hk, stride_kb, stride_ks, stride_kh, cols)
    k, v = load_pair(K, V, kv_offsets, s_ok)
    dk = tl.zeros([KEY_TILE, HEAD_DIM], tl.float32)
    dv = tl.zeros([KEY_TILE, HEAD_DIM], tl.float32)
    lo, hi, full_lo, full_hi = _query_range(s0, tl.minimum(s0 + KEY_TILE, n_keys), seq_len,
                                            band_a, band_b, MODE)
    if PARTIAL:  # this item's queries: those of [item, item + 1) * ITEM_QUERIES that see it
        lo = tl.maximum(lo, item * ITEM_QUERIES)
        hi = tl.minimum(hi, item * ITEM_QUERIES + ITEM_QUERIES)
    a, z = _unmasked_span(lo, hi, full_lo, full_hi, QUERY_TILE)
    for g in range(group):
        hq = hk * group + g
        for t0 in range(lo, a, QUERY_TILE):
            dk, dv = _dkdv_tile(Q, DO, LSE, DELTA, k, v, dk, dv, b, hq, t0, hi, s, s_ok,
                                stride_qb, stride_qs, stride_qh, stride_lb, stride_ls, cols,
                                scale_log2, band_a, band_b, True, MODE, QUERY_TILE, PRECISION)
        for t0 in range(a, z, QUERY_TILE):
            dk, dv = _dkdv_tile(Q, DO, LSE, DELTA, k, v, dk, dv, b, hq, t0, hi, s, s_ok,
                                stride_qb, stride_qs, stride_qh, stride_lb, stride_ls, cols,
                                scale_log2, band_a, band_b, False, MODE, QUERY_TILE,
                                PRECISION)
        for t0 in range(z, hi, QUERY_TILE):
            dk, dv = _dkdv_tile(Q, DO, LSE, DELTA, k, v, dk, dv, b, hq, t0, hi, s, s_ok,
                                stride_qb, stride_qs, stride_qh, stride_lb, stride_ls, cols,
                                scale_log2, band_a, band_b, True, MODE, QUERY_TILE, PRECISION)
    if PARTIAL:  # fp32 slot of this item, summed in item order by _band_dkdv_sum
        part = item * stride_item + kv_offsets
        tl.store(DK + part, dk * scale, mask=s_ok[:, None])
        tl.store(DV + part, dv, mask=s_ok[:, None])
    else:
        tl.store(DK + kv_offsets, (dk * scale).to(DK.dtype.element_ty), mask=s_ok[:, None])
        tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty), mask=s_ok[:, None])


@triton.jit
def _band_dkdv_sum(PART_DK, PART_DV, DK, DV, stride_kb, stride_ks, stride_kh, stride_item,
                   n_items, n_keys, n_kv_heads, HEAD_DIM: tl.constexpr, KEY_TILE: tl.constexpr):
    """dK, dV of one compressed key tile: its items' partials summed in item order (an item
    whose queries all precede the keys wrote zeros)."""
    s0 = tl.program_id(0).to(tl.int64) * KEY_TILE
    bh = tl.program_id(1).to(tl.int64)
    b, hk = bh // n_kv_heads, bh % n_kv_heads
    s = s0 + tl.arange(0, KEY_TILE)
    cols = tl.arange(0, HEAD_DIM)
    s_ok = (s < n_keys)[:, None]
    offsets = tile_offsets(b, s, hk, stride_kb, stride_ks, stride_kh, cols)
    dk = tl.zeros([KEY_TILE, HEAD_DIM], tl.float32)
    dv = tl.zeros([KEY_TILE, HEAD_DIM], tl.float32)
    for item in range(n_items):
        dk += tl.load(PART_DK + item * stride_item + offsets, mask=s_ok, other=0.0)
        dv += tl.load(PART_DV + item * stride_item + offsets, mask=s_ok, other=0.0)
    tl.store(DK + offsets, dk.to(DK.dtype.element_ty), mask=s_ok)
    tl.store(DV + offsets, dv.to(DV.dtype.element_ty), mask=s_ok)


def key_items(mode: int, seq: int) -> int:
    """Work items per key tile in dK/dV (the grid's third axis): a compressed key is seen by
    up to every later query, so queries are cut at multiples of ITEM_QUERIES; the window's
    band is short. Item c of every key tile reads the same queries, and the grid runs the
    key tiles of one item side by side, so those queries come from L2 rather than HBM."""
    return 1 if mode == WINDOW else max(1, triton.cdiv(seq, ITEM_QUERIES))


def _launch_args(q, k, lse):
    return (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            lse.stride(0), lse.stride(1))


def _band_forward(q, k, v, band, scale):
    """(o, lse) of band attention; q, k, v contiguous."""
    mode, band_a, band_b = band
    batch, seq, n_q_heads, head_dim = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(batch, seq, n_q_heads, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(seq, QUERY_TILE), batch * n_q_heads)
    _band_fwd[grid](q, k, v, o, lse, *_launch_args(q, k, lse), seq, k.shape[1], n_q_heads,
                    n_q_heads // k.shape[2], band_a, band_b, scale * LOG2E, MODE=mode,
                    HEAD_DIM=head_dim, QUERY_TILE=QUERY_TILE, KEY_TILE=KEY_TILE,
                    PRECISION=dot_precision(q), **launch_options(q.dtype, QUERY_TILE * head_dim))
    return o, lse


def band_backward(q, k, v, o, lse, do, band, scale):
    """(dq, dk, dv) of band attention from its forward's (o, lse); q, k, v, o contiguous."""
    mode, band_a, band_b = band
    batch, seq, n_q_heads, head_dim = q.shape
    n_keys, n_kv_heads = k.shape[1], k.shape[2]
    group = n_q_heads // n_kv_heads
    do = do.contiguous()
    delta = row_dot(o, do)
    constants = dict(MODE=mode, HEAD_DIM=head_dim, QUERY_TILE=QUERY_TILE, KEY_TILE=KEY_TILE,
                     PRECISION=dot_precision(q),
                     **launch_options(q.dtype, QUERY_TILE * head_dim))
    dq = torch.empty_like(q)
    _band_dq[(triton.cdiv(seq, QUERY_TILE), batch * n_q_heads)](
        q, k, v, do, lse, delta, dq, *_launch_args(q, k, lse), seq, n_keys, n_q_heads, group,
        band_a, band_b, scale, scale * LOG2E, **constants)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if n_keys == 0:
        return dq, dk, dv
    items = key_items(mode, seq)
    key_grid = (triton.cdiv(n_keys, KEY_TILE), batch * n_kv_heads)
    if items == 1:
        _band_dkdv[(*key_grid, 1)](
            q, k, v, do, lse, delta, dk, dv, *_launch_args(q, k, lse), 0, seq, n_keys,
            n_kv_heads, group, band_a, band_b, scale, scale * LOG2E, ITEM_QUERIES=ITEM_QUERIES,
            PARTIAL=False, **constants)
        return dq, dk, dv
    # fp32 partials, one slot per item, summed in item order: still deterministic
    part_dk = torch.empty(items, *k.shape, device=k.device, dtype=torch.float32)
    part_dv = torch.empty_like(part_dk)
    _band_dkdv[(*key_grid, items)](
        q, k, v, do, lse, delta, part_dk, part_dv, *_launch_args(q, k, lse), k.numel(), seq,
        n_keys, n_kv_heads, group, band_a, band_b, scale, scale * LOG2E,
        ITEM_QUERIES=ITEM_QUERIES, PARTIAL=True, **constants)
    _band_dkdv_sum[key_grid](part_dk, part_dv, dk, dv, k.stride(0), k.stride(1), k.stride(2),
                             k.numel(), items, n_keys, n_kv_heads, HEAD_DIM=head_dim,
                             KEY_TILE=KEY_TILE)
    return dq, dk, dv


class _BandAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, band, scale):
        check_shapes(q, k, v)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        o, lse = _band_forward(q, k, v, band, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.band, ctx.scale = band, scale
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = band_backward(q, k, v, o, lse, do, ctx.band, ctx.scale)
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
