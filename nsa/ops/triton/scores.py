"""Block scores for selection (NSA Eq.8-10) in Triton, from the compressed branch's lse.

Same semantics as `nsa.ops.selection` (see its docstring): for query t and query head h,
p_t[i] = exp(scale * q_t . K_cmp[i] - lse_t) over the compressed tokens visible to t
(i*d + l - 1 <= t), the block score of block j is sum_i p_t[i] * overlap(span_i, block_j) / d,
and the scores of the G query heads of a KV group are summed (Eq.10).

When the compressed branch ran, its log-sum-exp (in units of scale * q.k, fp32 [B, S, Hq]) is
passed in and the probabilities come out of one pass over K_cmp: nothing recomputes the
softmax. Without it (a model whose branches select but do not attend to compressed tokens) a
first pass over K_cmp computes the lse.

One program per (tile of queries, batch x kv head). Its rows are (query, head) pairs of the
group, so K_cmp tiles are read once for all of the group's heads; the span-to-block overlap
weights of a key tile are a small matrix built from positions, and one `tl.dot` turns the
tile's probabilities into the scores of the blocks it covers. Key tiles are aligned to
selection blocks, so a tile's blocks are complete except the one that the last spans spill
into, which is carried to the next tile. Nothing of size S x N exists; the output is the
[B, T, Hkv, n_blocks] scores of the queries asked for.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops.triton._common import dot_precision, pow2_at_least

__all__ = ["block_scores"]

TILE_ROWS = 64
"""(query, head) rows per program: queries = TILE_ROWS // (group padded to a power of 2)."""
LAUNCH = {"num_warps": 4, "num_stages": 2}
"""Warps and pipeline stages of the score kernel (fp32 inputs take one stage)."""


@triton.jit
def _visible_tokens(t_last, n_cmp, cmp_len, cmp_stride):
    """Compressed tokens i with i*d + l - 1 <= t_last (the tile's last query)."""
    return tl.minimum(tl.where(t_last >= cmp_len - 1, (t_last - cmp_len + 1) // cmp_stride + 1,
                               0), n_cmp)


@triton.jit
def _stored(score, j, t, block_len, KEYS: tl.constexpr):
    """What the output holds for blocks j [C] of queries t [R]: the fp32 score, or (KEYS) the
    int64 rank key of `nsa.ops.selection.block_rank_keys`, bit for bit."""
    if KEYS:
        bits = score.to(tl.int32, bitcast=True)
        monotone = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)
        inverted = (2147483647 - j).to(tl.int64)[None, :]
        key = monotone * 4294967296 + inverted
        available = j[None, :] * block_len <= t[:, None]
        local = (t // block_len)[:, None]
        forced = available & ((j[None, :] == 0) | (j[None, :] == local)
                              | (j[None, :] == local - 1))
        key = tl.where(available, key, -9223372036854775807 - 1)
        return tl.where(forced, 9223372036854775807 - inverted, key)
    else:
        return score


@triton.jit
def _block_scores(Q, K, LSE, OUT,
                  stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                  stride_lb, stride_ls, stride_ob, stride_os, stride_oh,
                  q_start, n_queries, n_cmp, n_kv_heads, n_blocks, scale,
                  cmp_len, cmp_stride, block_len,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, QUERIES: tl.constexpr,
                  HEAD_DIM: tl.constexpr, KEY_TILE: tl.constexpr,
                  TILE_BLOCKS: tl.constexpr, COLS: tl.constexpr, HAS_LSE: tl.constexpr,
                  KEYS: tl.constexpr, PRECISION: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_kv_heads, bh % n_kv_heads
    rows = tl.arange(0, QUERIES * GROUP_PAD)
    local = tile * QUERIES + rows // GROUP_PAD
    g = rows % GROUP_PAD
    t = q_start + local
    row_ok = (local < n_queries) & (g < GROUP)
    head = h * GROUP + g
    cols = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + b * stride_qb + t[:, None] * stride_qs + head[:, None] * stride_qh
                + cols[None, :], mask=row_ok[:, None], other=0.0)
    t_last = q_start + tl.minimum(tile * QUERIES + QUERIES, n_queries) - 1
    n_vis = _visible_tokens(t_last, n_cmp, cmp_len, cmp_stride)
    tokens = tl.arange(0, KEY_TILE)
    if HAS_LSE:
        lse = tl.load(LSE + b * stride_lb + t * stride_ls + head, mask=row_ok, other=0.0)
    else:
        m = tl.full([QUERIES * GROUP_PAD], float("-inf"), tl.float32)
        denom = tl.zeros([QUERIES * GROUP_PAD], tl.float32)
        for i0 in range(0, n_vis, KEY_TILE):
            i = i0 + tokens
            k = tl.load(K + b * stride_kb + i[:, None] * stride_ks + h * stride_kh
                        + cols[None, :], mask=(i < n_vis)[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            seen = (i[None, :] * cmp_stride + cmp_len - 1 <= t[:, None]) & (i < n_vis)[None, :]
            s = tl.where(seen, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            denom = denom * tl.exp(m - m_safe) + tl.sum(tl.exp(s - m_safe[:, None]), 1)
            m = m_new
        lse = tl.where(denom > 0, m + tl.log(tl.where(denom > 0, denom, 1.0)), 0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    # compressed tokens per selection block: key tiles start on block boundaries
    per_block = block_len // cmp_stride
    block_cols = tl.arange(0, COLS)
    query_rows = tile * QUERIES + tl.arange(0, QUERIES)
    query_ok = query_rows < n_queries
    query_pos = q_start + query_rows
    out_rows = OUT + b * stride_ob + query_rows * stride_os + h * stride_oh
    carry = tl.zeros([QUERIES], tl.float32)
    for i0 in range(0, n_vis, KEY_TILE):
        i = i0 + tokens
        k = tl.load(K + b * stride_kb + i[:, None] * stride_ks + h * stride_kh + cols[None, :],
                    mask=(i < n_vis)[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        seen = (i[None, :] * cmp_stride + cmp_len - 1 <= t[:, None]) & (i < n_vis)[None, :] \
            & row_ok[:, None]
        p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)
        # overlap of span i with block j, over d (Eq.9 written with spans)
        j0 = i0 // per_block
        j = j0 + block_cols
        span_start = i * cmp_stride
        lo = tl.maximum(span_start[:, None], j[None, :] * block_len)
        hi = tl.minimum(span_start[:, None] + cmp_len, j[None, :] * block_len + block_len)
        weight = tl.maximum(hi - lo, 0).to(tl.float32) / cmp_stride
        per_row = tl.dot(p, weight, input_precision="ieee")  # [rows, COLS]
        per_query = tl.sum(tl.reshape(per_row, [QUERIES, GROUP_PAD, COLS]), 1)
        per_query += tl.where(block_cols[None, :] == 0, carry[:, None], 0.0)
        carry = tl.sum(tl.where(block_cols[None, :] == TILE_BLOCKS, per_query, 0.0), 1)
        keep = query_ok[:, None] & (block_cols[None, :] < TILE_BLOCKS) & (j[None, :] < n_blocks)
        tl.store(out_rows[:, None] + j[None, :], _stored(per_query, j, query_pos, block_len, KEYS),
                 mask=keep)
    # the block that the last tile's spans spill into (zero when nothing spilled), then the
    # blocks no visible span reaches: score 0 (already 0 in a zeroed score buffer)
    written = (n_vis + KEY_TILE - 1) // KEY_TILE * TILE_BLOCKS
    rest = written
    if KEYS:
        rest = 0
    for j0 in range(rest, n_blocks, COLS):
        j = j0 + block_cols
        score = tl.where((j == written)[None, :] & (n_vis > 0), carry[:, None], 0.0)
        tl.store(out_rows[:, None] + j[None, :], _stored(score, j, query_pos, block_len, KEYS),
                 mask=query_ok[:, None] & (j[None, :] < n_blocks) & (j[None, :] >= written))


def block_scores(q: torch.Tensor, k_cmp: torch.Tensor, lse: torch.Tensor | None,
                 q_start: int, n_queries: int, n_blocks: int, cmp_len: int, cmp_stride: int,
                 block_len: int, scale: float, rank_keys: bool = False) -> torch.Tensor:
    """Group block scores (Eq.8-10) of queries [q_start, q_start + n_queries).

    q [B, S, Hq, D], k_cmp [B, N, Hkv, D] (same dtype), lse [B, S, Hq] fp32 from the
    compressed branch or None -> fp32 [B, n_queries, Hkv, n_blocks]; blocks with no visible
    span score 0. With rank_keys, int64 keys of the same shape instead, equal to
    `nsa.ops.selection.block_rank_keys` of those scores (Eq.11's order)."""
    batch, _, n_q_heads, head_dim = q.shape
    n_cmp, n_kv_heads = k_cmp.shape[1], k_cmp.shape[2]
    group = n_q_heads // n_kv_heads
    group_pad = pow2_at_least(group, 1)
    queries = max(1, TILE_ROWS // group_pad)
    per_block = block_len // cmp_stride
    key_tile = max(64, per_block)
    tile_blocks = key_tile // per_block
    cols = pow2_at_least(tile_blocks + 1, 16)
    shape = (batch, n_queries, n_kv_heads, n_blocks)
    out = (torch.empty(shape, device=q.device, dtype=torch.int64) if rank_keys
           else torch.zeros(shape, device=q.device, dtype=torch.float32))
    if n_queries == 0:
        return out
    q = q.contiguous()
    k_cmp = k_cmp.contiguous() if n_cmp else q  # no compressed token is ever read then
    lse_arg = lse.contiguous() if lse is not None else q
    grid = (triton.cdiv(n_queries, queries), batch * n_kv_heads)
    _block_scores[grid](q, k_cmp, lse_arg, out,
                        q.stride(0), q.stride(1), q.stride(2),
                        k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2),
                        lse_arg.stride(0), lse_arg.stride(1),
                        out.stride(0), out.stride(1), out.stride(2),
                        q_start, n_queries, n_cmp, n_kv_heads, n_blocks, scale,
                        cmp_len, cmp_stride, block_len,
                        GROUP=group, GROUP_PAD=group_pad, QUERIES=queries, HEAD_DIM=head_dim,
                        KEY_TILE=key_tile, TILE_BLOCKS=tile_blocks, COLS=cols,
                        HAS_LSE=lse is not None, KEYS=rank_keys, PRECISION=dot_precision(q),
                        num_warps=LAUNCH["num_warps"],
                        num_stages=1 if q.dtype == torch.float32 else LAUNCH["num_stages"])
    return out
