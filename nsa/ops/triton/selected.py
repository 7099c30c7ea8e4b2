"""Selected-block attention in Triton: group-centric forward, dQ, and atomic-free dK/dV.

Same contract as `nsa.ops.torch.selected_attention`: q [B, S, Hq, D]; k, v [B, S, Hkv, D];
block_indices [B, S, Hkv, n] int64 with -1 padding (entries outside [0, ceil(S / block_size))
or lying wholly after t are ignored). Query t of head h reads kv head h // G and attends key s
iff s // block_size is a valid entry of its row and s <= t. A row with no visible key gives
o = 0, lse = -inf and zero gradients. lse is fp32 [B, S, Hq] in units of scale * q.k.

Forward and dQ: one program per (query position, batch x kv head) holds the G query heads of
the group as the rows of one tile (padded to 16 rows for `tl.dot`), and loads each selected
K/V block once for all of them, with an online softmax over the n blocks.

dK/dV: no atomics. The selection is inverted on the device (a stable sort of the flattened
(b, kv head, block) keys) into, per block, the ascending list of queries that selected it.
Each list is cut into work items of at most `ITEM_QUERIES` queries, so block 0 (chosen by
every query) spreads over many programs instead of serialising on one; each item writes a
partial dK/dV and a second kernel sums a block's partials in item order. Every sum therefore
runs in a fixed order and the gradients are identical bit for bit between runs.
All offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from nsa.ops.indices import unique_block_indices
from nsa.ops.triton._common import (
    check_shapes,
    dot_precision,
    group_tile_rows,
    launch_options,
    pow2_at_least,
)
from nsa.ops.triton._tiles import (
    finish_softmax,
    load_pair,
    load_stats,
    online_softmax_step,
    probs_and_score_grads,
    row_dot,
    tile_offsets,
)

__all__ = ["ITEM_QUERIES", "selected_attention", "selected_attention_with_lse"]

ITEM_QUERIES = 1024
"""Queries of one block's list handled by one dK/dV program."""

def dkdv_tile_rows(dtype: torch.dtype) -> int:
    """(query, head) rows per dK/dV tile: queries x the group's heads (padded to a power of
    2); half as many for fp32, whose q and do tiles take twice the bytes."""
    return 32 if dtype == torch.float32 else 64


@triton.jit
def _selected_block(K, V, index_ptr, t, b, h, stride_kb, stride_ks, stride_kh, seq_len,
                    n_blocks, keys, cols, BLOCK: tl.constexpr):
    """K and V of the block named at `index_ptr` [BLOCK, D] and which of its keys query t may
    see; an index that is padding, out of range or wholly after t masks every key."""
    j = tl.load(index_ptr).to(tl.int64)
    usable = (j >= 0) & (j < n_blocks) & (j * BLOCK <= t)
    pos = tl.where(usable, j, 0) * BLOCK + keys
    key_ok = usable & (pos <= t) & (pos < seq_len)
    k, v = load_pair(K, V, tile_offsets(b, pos, h, stride_kb, stride_ks, stride_kh, cols), key_ok)
    return k, v, key_ok


@triton.jit
def _selected_fwd(Q, K, V, IDX, O, LSE,
                  stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                  stride_ib, stride_is, stride_ih, stride_lb, stride_ls,
                  seq_len, n_kv_heads, n_sel, n_blocks, scale,
                  GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_kv_heads, bh % n_kv_heads
    rows = tl.arange(0, GROUP_PAD)
    cols = tl.arange(0, HEAD_DIM)
    keys = tl.arange(0, BLOCK)
    row_ok = rows < GROUP
    heads = h * GROUP + rows
    q = tl.load(Q + b * stride_qb + t * stride_qs + heads[:, None] * stride_qh + cols[None, :],
                mask=row_ok[:, None], other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    idx_row = IDX + b * stride_ib + t * stride_is + h * stride_ih
    for i in range(n_sel):
        k, v, key_ok = _selected_block(K, V, idx_row + i, t, b, h, stride_kb, stride_ks,
                                       stride_kh, seq_len, n_blocks, keys, cols, BLOCK)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(key_ok[None, :], scores, float("-inf"))
        m, denom, acc = online_softmax_step(scores, v, m, denom, acc, PRECISION, False)
    o, lse = finish_softmax(m, denom, acc)
    tl.store(O + b * stride_qb + t * stride_qs + heads[:, None] * stride_qh + cols[None, :],
             o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + b * stride_lb + t * stride_ls + heads, lse, mask=row_ok)


@triton.jit
def _selected_dq(Q, K, V, IDX, DO, LSE, DELTA, DQ,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_ib, stride_is, stride_ih, stride_lb, stride_ls,
                 seq_len, n_kv_heads, n_sel, n_blocks, scale,
                 GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK: tl.constexpr, PRECISION: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_kv_heads, bh % n_kv_heads
    rows = tl.arange(0, GROUP_PAD)
    cols = tl.arange(0, HEAD_DIM)
    keys = tl.arange(0, BLOCK)
    row_ok = rows < GROUP
    heads = h * GROUP + rows
    row_offsets = b * stride_qb + t * stride_qs + heads[:, None] * stride_qh + cols[None, :]
    q, do = load_pair(Q, DO, row_offsets, row_ok)
    lse, delta = load_stats(LSE, DELTA, b * stride_lb + t * stride_ls + heads, row_ok)
    dq = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    idx_row = IDX + b * stride_ib + t * stride_is + h * stride_ih
    for i in range(n_sel):
        k, v, key_ok = _selected_block(K, V, idx_row + i, t, b, h, stride_kb, stride_ks,
                                       stride_kh, seq_len, n_blocks, keys, cols, BLOCK)
        _, ds = probs_and_score_grads(q, k, v, do, lse, delta, key_ok[None, :], scale,
                                      PRECISION)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + row_offsets, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _selected_dkdv_items(Q, K, V, DO, LSE, DELTA, QUERIES, ITEM_KEY, ITEM_BEGIN, ITEM_END,
                         PART_DK, PART_DV,
                         stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                         stride_lb, stride_ls,
                         seq_len, n_kv_heads, n_blocks, n_keys, scale,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK: tl.constexpr, QUERIES_PER_TILE: tl.constexpr,
                         PRECISION: tl.constexpr):
    item = tl.program_id(0).to(tl.int64)
    key = tl.load(ITEM_KEY + item)
    begin = tl.load(ITEM_BEGIN + item)
    end = tl.load(ITEM_END + item)
    live = key < n_keys
    key = tl.where(live, key, 0)
    end = tl.where(live, end, begin)
    bh, j = key // n_blocks, key % n_blocks
    b, h = bh // n_kv_heads, bh % n_kv_heads
    cols = tl.arange(0, HEAD_DIM)
    pos = j * BLOCK + tl.arange(0, BLOCK)
    key_in_seq = pos < seq_len
    k, v = load_pair(K, V, tile_offsets(b, pos, h, stride_kb, stride_ks, stride_kh, cols),
                     key_in_seq)
    dk = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
    # rows of a tile: QUERIES_PER_TILE queries x GROUP_PAD heads of the kv group
    rows = tl.arange(0, QUERIES_PER_TILE * GROUP_PAD)
    query_slot, g = rows // GROUP_PAD, rows % GROUP_PAD
    for start in range(begin, end, QUERIES_PER_TILE):
        slot = start + query_slot
        row_ok = (slot < end) & (g < GROUP)
        t = tl.load(QUERIES + slot, mask=row_ok, other=0)
        head = h * GROUP + g
        row_offsets = b * stride_qb + t[:, None] * stride_qs + head[:, None] * stride_qh \
            + cols[None, :]
        q, do = load_pair(Q, DO, row_offsets, row_ok)
        lse, delta = load_stats(LSE, DELTA, b * stride_lb + t * stride_ls + head, row_ok)
        allowed = row_ok[:, None] & key_in_seq[None, :] & (pos[None, :] <= t[:, None])
        p, ds = probs_and_score_grads(q, k, v, do, lse, delta, allowed, scale, PRECISION)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    tile = item * BLOCK * HEAD_DIM + tl.arange(0, BLOCK)[:, None] * HEAD_DIM + cols[None, :]
    tl.store(PART_DK + tile, dk * scale)
    tl.store(PART_DV + tile, dv)


@triton.jit
def _selected_dkdv_reduce(PART_DK, PART_DV, KEY_FIRST_ITEM, KEY_ITEMS, DK, DV,
                          stride_kb, stride_ks, stride_kh, seq_len, n_kv_heads, n_blocks,
                          HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    key = tl.program_id(0).to(tl.int64)
    first = tl.load(KEY_FIRST_ITEM + key)
    count = tl.load(KEY_ITEMS + key)
    bh, j = key // n_blocks, key % n_blocks
    b, h = bh // n_kv_heads, bh % n_kv_heads
    cols = tl.arange(0, HEAD_DIM)
    local = tl.arange(0, BLOCK)[:, None] * HEAD_DIM + cols[None, :]
    dk = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
    for item in range(first, first + count):
        dk += tl.load(PART_DK + item * BLOCK * HEAD_DIM + local)
        dv += tl.load(PART_DV + item * BLOCK * HEAD_DIM + local)
    pos = j * BLOCK + tl.arange(0, BLOCK)
    in_seq = (pos < seq_len)[:, None]
    offsets = b * stride_kb + pos[:, None] * stride_ks + h * stride_kh + cols[None, :]
    tl.store(DK + offsets, dk.to(DK.dtype.element_ty), mask=in_seq)
    tl.store(DV + offsets, dv.to(DV.dtype.element_ty), mask=in_seq)


def _work_items(block_indices: torch.Tensor, block_size: int, n_blocks: int):
    """Invert the selection into per-block query lists cut into work items, on the device.

    Returns (queries [M] int64: query positions grouped by key (b, kv head, block) in
    ascending order; item_key, item_begin, item_end [I]: the key of each item and its slice of
    `queries` (items past the real ones have key n_keys); key_first_item, key_items [n_keys]).
    I is a bound known from shapes alone, so nothing waits for the device."""
    batch, seq, n_kv_heads, n_sel = block_indices.shape
    device = block_indices.device
    n_keys = batch * n_kv_heads * n_blocks
    t = torch.arange(seq, device=device).view(1, seq, 1, 1)
    usable = (block_indices >= 0) & (block_indices < n_blocks) & (block_indices * block_size <= t)
    bh = (torch.arange(batch, device=device).view(batch, 1, 1, 1) * n_kv_heads
          + torch.arange(n_kv_heads, device=device).view(1, 1, n_kv_heads, 1))
    key = torch.where(usable, bh * n_blocks + block_indices, n_keys).flatten()
    # a stable sort keeps each key's queries ascending: entries are laid out (b, t, h, i)
    sorted_key, order = torch.sort(key, stable=True)
    queries = t.expand_as(block_indices).flatten()[order].contiguous()
    bounds = torch.searchsorted(sorted_key, torch.arange(n_keys + 1, device=device))
    key_begin, counts = bounds[:-1], bounds[1:] - bounds[:-1]
    key_items = (counts + ITEM_QUERIES - 1) // ITEM_QUERIES
    items_through = torch.cumsum(key_items, 0)
    key_first_item = items_through - key_items
    max_items = -(-key.numel() // ITEM_QUERIES) + n_keys
    item = torch.arange(max_items, device=device)
    item_key = torch.searchsorted(items_through, item, right=True)
    safe_key = item_key.clamp(max=n_keys - 1)
    item_begin = key_begin[safe_key] + (item - key_first_item[safe_key]) * ITEM_QUERIES
    item_end = torch.minimum(item_begin + ITEM_QUERIES, key_begin[safe_key] + counts[safe_key])
    return queries, item_key, item_begin, item_end, key_first_item, key_items


class _SelectedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_indices, block_size, scale):
        check_shapes(q, k, v, block_size=block_size)
        batch, seq, n_q_heads, head_dim = q.shape
        n_kv_heads = k.shape[2]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        block_indices = block_indices.contiguous()
        o = torch.empty_like(q)
        lse = torch.empty(batch, seq, n_q_heads, device=q.device, dtype=torch.float32)
        n_blocks = -(-seq // block_size)
        grid = (seq, batch * n_kv_heads)
        _selected_fwd[grid](q, k, v, block_indices, o, lse,
                            q.stride(0), q.stride(1), q.stride(2),
                            k.stride(0), k.stride(1), k.stride(2),
                            block_indices.stride(0), block_indices.stride(1),
                            block_indices.stride(2), lse.stride(0), lse.stride(1),
                            seq, n_kv_heads, block_indices.shape[-1], n_blocks, scale,
                            GROUP=n_q_heads // n_kv_heads,
                            GROUP_PAD=group_tile_rows(n_q_heads // n_kv_heads), HEAD_DIM=head_dim,
                            BLOCK=block_size, PRECISION=dot_precision(q),
                            **launch_options(q.dtype, block_size * head_dim))
        ctx.save_for_backward(q, k, v, block_indices, o, lse)
        ctx.block_size, ctx.scale = block_size, scale
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, block_indices, o, lse = ctx.saved_tensors
        block_size, scale = ctx.block_size, ctx.scale
        batch, seq, n_q_heads, head_dim = q.shape
        n_kv_heads, n_sel = k.shape[2], block_indices.shape[-1]
        group = n_q_heads // n_kv_heads
        group_pad = group_tile_rows(group)
        precision = dot_precision(q)
        n_blocks = -(-seq // block_size)
        do = do.contiguous()
        delta = row_dot(o, do)
        dq = torch.empty_like(q)
        _selected_dq[(seq, batch * n_kv_heads)](
            q, k, v, block_indices, do, lse, delta, dq,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            block_indices.stride(0), block_indices.stride(1), block_indices.stride(2),
            lse.stride(0), lse.stride(1), seq, n_kv_heads, n_sel, n_blocks, scale,
            GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, BLOCK=block_size,
            PRECISION=precision, **launch_options(q.dtype, block_size * head_dim))
        queries, item_key, item_begin, item_end, key_first_item, key_items = _work_items(
            block_indices, block_size, n_blocks)
        n_items = item_key.numel()
        part_dk = torch.empty(n_items, block_size, head_dim, device=q.device, dtype=torch.float32)
        part_dv = torch.empty_like(part_dk)
        n_keys = batch * n_kv_heads * n_blocks
        _selected_dkdv_items[(n_items,)](
            q, k, v, do, lse, delta, queries, item_key, item_begin, item_end, part_dk, part_dv,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            lse.stride(0), lse.stride(1), seq, n_kv_heads, n_blocks, n_keys, scale,
            GROUP=group, GROUP_PAD=pow2_at_least(group, 1), HEAD_DIM=head_dim, BLOCK=block_size,
            QUERIES_PER_TILE=max(1, dkdv_tile_rows(q.dtype) // pow2_at_least(group, 1)),
            PRECISION=precision, **launch_options(q.dtype, block_size * head_dim))
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        _selected_dkdv_reduce[(n_keys,)](
            part_dk, part_dv, key_first_item, key_items, dk, dv,
            k.stride(0), k.stride(1), k.stride(2), seq, n_kv_heads, n_blocks,
            HEAD_DIM=head_dim, BLOCK=block_size)
        return dq, dk, dv, None, None, None


def selected_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                block_indices: torch.Tensor, block_size: int,
                                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, non-differentiable); see the module docstring."""
    return _SelectedAttention.apply(q, k, v, unique_block_indices(block_indices), block_size,
                                    float(scale))


def selected_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       block_indices: torch.Tensor, block_size: int,
                       scale: float) -> torch.Tensor:
    """o [B, S, Hq, D]; see the module docstring."""
    return selected_attention_with_lse(q, k, v, block_indices, block_size, scale)[0]
