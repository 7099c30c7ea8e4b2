"""Compressed attention and block selection (NSA Eq.7-11) in one Triton kernel.

Same semantics as `nsa.ops.selection` and `nsa.ops.torch.compressed_attention`: for query t
and query head h, p_t[i] = exp(scale * q_t . K_cmp[i] - lse_t) over the compressed tokens
visible to t (i*d + l - 1 <= t); the compressed branch's output is sum_i p_t[i] V_cmp[i]; the
score of selection block j is sum_i p_t[i] * overlap(span_i, block_j) / d (Eq.9), summed over
the G query heads of a KV group (Eq.10); Eq.11 takes block 0, the two local blocks and then
the highest scores, ties to the lower block index.

One program per (tile of queries, batch x kv head). Its rows are the (query, head) pairs of
the group, so every K_cmp/V_cmp tile is read once for all of the group's heads. The program
makes two passes over the visible compressed tokens:
  1. the online softmax: lse, and with values the branch output o (FIRST_PASS 2), or lse only
     (FIRST_PASS 1, a model that selects without the compressed branch), or nothing when the
     compressed branch's lse is given (FIRST_PASS 0);
  2. the probabilities exp(s - lse) of each key tile, summed over the group's heads first
     (Eq.10 is linear), then turned into block scores by a constant span-to-block overlap
     matrix (key tiles start on selection-block boundaries; the one block that the tile's last
     spans spill into is carried to the next tile).
Exact probabilities need the row's final lse, so the scores cannot come out of pass 1: they
would have to be kept per head for every block until the end (G x n_blocks per query).
The scores are either written out (OUTPUT 0, fp32 [B, T, Hkv, n_blocks], for tests and
diagnostics) or folded into a running top-n per query (OUTPUT 1): each tile's blocks become
int64 keys ordered like `nsa.ops.selection.block_rank_keys` (score bits high, inverted block
index low, forced blocks highest, unavailable blocks lowest) and `tl.topk` keeps the best
TILE_BLOCKS of the running list and the tile's blocks. Nothing of size S x n_blocks exists;
the output is [B, S, Hkv, n_sel] int64, ascending, -1 padding.

Only key tiles that hold a token some query of the program cannot see are masked; the rest
run without position arithmetic. Programs start with the latest queries (the most tokens),
so the longest ones are not left for the end of the grid. All offsets are int64.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from nsa.ops.triton._common import check_shapes, dot_precision, pow2_at_least

__all__ = ["TILE_ROWS", "block_scores", "compressed_attention_and_selection", "select_blocks"]

TILE_ROWS = 64
"""(query, head) rows per program: queries = TILE_ROWS // (group padded to a power of 2)."""
LAUNCH = {"num_warps": 4, "num_stages": 2}
"""Warps and pipeline stages (fp32 inputs take one stage)."""
LOG2E = math.log2(math.e)

FIRST_PASS_NONE, FIRST_PASS_LSE, FIRST_PASS_OUTPUT = 0, 1, 2
OUTPUT_SCORES, OUTPUT_INDICES, OUTPUT_NONE = 0, 1, 2


@triton.jit
def _visible_count(t, n_cmp, cmp_len, cmp_stride):
    """Compressed tokens i with i*d + l - 1 <= t (t a scalar position)."""
    return tl.minimum(tl.where(t >= cmp_len - 1, (t - cmp_len + 1) // cmp_stride + 1, 0), n_cmp)


@triton.jit
def _overlap(span_lo, span_len, block_lo, block_len):
    """Length of [span_lo, span_lo + span_len) within [block_lo, block_lo + block_len)."""
    lo = tl.maximum(span_lo, block_lo)
    hi = tl.minimum(span_lo + span_len, block_lo + block_len)
    return tl.maximum(hi - lo, 0)


@triton.jit
def _rank_keys(score, j, t, block_len):
    """int64 keys [Q, C] of blocks j [C] for queries t [Q]: a larger key is a better block.

    High 32 bits: INT32_MAX for forced blocks (block 0 and the two local ones), the fp32
    score's bits made monotone for available blocks, INT32_MIN for unavailable ones
    (j * l_sel > t); low 32 bits: INT32_MAX - j, so ties go to the lower index."""
    bits = (score + 0.0).to(tl.int32, bitcast=True)  # + 0.0 folds -0.0 into 0.0
    monotone = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    available = j[None, :] * block_len <= t[:, None]
    local = (t // block_len)[:, None]
    forced = available & ((j[None, :] == 0) | (j[None, :] == local) | (j[None, :] == local - 1))
    high = tl.where(forced, 2147483647, tl.where(available, monotone, -2147483648))
    return high.to(tl.int64) * 4294967296 + (2147483647 - j[None, :]).to(tl.int64)


@triton.jit
def _emit_scores(scores, j, running, query_pos, query_ok, out_rows, n_blocks, block_len,
                 QUERIES: tl.constexpr, TILE_BLOCKS: tl.constexpr, OUTPUT: tl.constexpr):
    """Scores [QUERIES, TILE_BLOCKS] of blocks j: written to the score rows (OUTPUT 0), or
    merged into the running top list of int64 rank keys (OUTPUT 1). Returns the list."""
    if OUTPUT == 0:
        tl.store(out_rows[:, None] + j[None, :], scores,
                 mask=query_ok[:, None] & (j[None, :] < n_blocks))
    else:
        keys = _rank_keys(scores, j, query_pos, block_len)
        both = tl.reshape(tl.join(running, keys), [QUERIES, 2 * TILE_BLOCKS])
        running = tl.topk(both, TILE_BLOCKS)
    return running


@triton.jit
def _fold_tile(p, j0, carry, running, own, spill, query_pos, query_ok, out_rows, n_blocks,
               block_len, QUERIES: tl.constexpr, GROUP_PAD: tl.constexpr,
               KEY_TILE: tl.constexpr, TILE_BLOCKS: tl.constexpr, OUTPUT: tl.constexpr):
    """Blocks j0 .. j0 + TILE_BLOCKS - 1 from one key tile's probabilities p [rows, KEY_TILE]
    (rows = (query, head)): their scores are written (OUTPUT 0) or merged into the running
    top list (OUTPUT 1). Returns the carry into block j0 + TILE_BLOCKS and the list."""
    per_query = tl.sum(tl.reshape(p, [QUERIES, GROUP_PAD, KEY_TILE]), 1)
    if QUERIES >= 16:
        scores = tl.dot(per_query, own, input_precision="ieee")
    else:
        scores = tl.sum(per_query[:, :, None] * own[None, :, :], 1)
    blocks = tl.arange(0, TILE_BLOCKS)
    scores += tl.where(blocks[None, :] == 0, carry[:, None], 0.0)
    carry = tl.sum(per_query * spill[None, :], 1)
    running = _emit_scores(scores, j0 + blocks, running, query_pos, query_ok, out_rows,
                           n_blocks, block_len, QUERIES, TILE_BLOCKS, OUTPUT)
    return carry, running


@triton.jit
def _logits(q, K, offsets, i, t, n_vis, scale_log2, cmp_len, cmp_stride,
            MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Logits in log2 units [rows, KEY_TILE] of tokens i against the rows' queries q (at
    positions t), -inf where a row cannot see a token (only computed when MASKED)."""
    if MASKED:
        k = tl.load(K + offsets, mask=(i < n_vis)[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        seen = (i[None, :] * cmp_stride + cmp_len - 1 <= t[:, None]) & (i < n_vis)[None, :]
        s = tl.where(seen, s, float("-inf"))
    else:
        k = tl.load(K + offsets)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    return s


@triton.jit
def _softmax_tile(s, V, offsets, ok, m, denom, acc, WITH_V: tl.constexpr,
                  PRECISION: tl.constexpr):
    """Fold one tile of log2 logits s into the running max m, denominator and (WITH_V)
    output accumulator acc; a row that has seen nothing keeps m = -inf without NaNs."""
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m - m_safe)
    denom = denom * alpha + tl.sum(p, 1)
    if WITH_V:
        v = tl.load(V + offsets, mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, denom, acc


@triton.jit
def _compressed_select(Q, K, V, LSE_IN, O, LSE_OUT, OUT,
                       stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                       stride_lb, stride_ls, stride_ob, stride_os, stride_oh,
                       q_start, n_queries, n_cmp, n_kv_heads, n_blocks, n_sel, scale_log2,
                       cmp_len, cmp_stride, block_len,
                       GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, QUERIES: tl.constexpr,
                       HEAD_DIM: tl.constexpr, KEY_TILE: tl.constexpr,
                       TILE_BLOCKS: tl.constexpr, FIRST_PASS: tl.constexpr,
                       OUTPUT: tl.constexpr, PRECISION: tl.constexpr):
    n_tiles = tl.cdiv(n_queries, QUERIES)
    tile = (n_tiles - 1 - tl.program_id(0)).to(tl.int64)  # latest queries first
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // n_kv_heads, bh % n_kv_heads
    rows = tl.arange(0, QUERIES * GROUP_PAD)
    local = tile * QUERIES + rows // GROUP_PAD
    g = rows % GROUP_PAD
    t = q_start + local
    row_ok = (local < n_queries) & (g < GROUP)
    head = h * GROUP + g
    cols = tl.arange(0, HEAD_DIM)
    q_offsets = b * stride_qb + t[:, None] * stride_qs + head[:, None] * stride_qh + cols[None, :]
    q = tl.load(Q + q_offsets, mask=row_ok[:, None], other=0.0)
    stat_offsets = b * stride_lb + t * stride_ls + head
    t_first = q_start + tile * QUERIES
    t_last = q_start + tl.minimum(tile * QUERIES + QUERIES, n_queries) - 1
    # tokens [0, n_full) are seen by every query of the tile: whole tiles need no mask
    n_full = _visible_count(t_first, n_cmp, cmp_len, cmp_stride) // KEY_TILE * KEY_TILE
    n_vis = _visible_count(t_last, n_cmp, cmp_len, cmp_stride)
    tokens = tl.arange(0, KEY_TILE)
    kv_base = b * stride_kb + h * stride_kh + cols[None, :]

    if FIRST_PASS == 0:
        lse2 = tl.load(LSE_IN + stat_offsets, mask=row_ok, other=0.0) * 1.4426950408889634
    else:
        m = tl.full([QUERIES * GROUP_PAD], float("-inf"), tl.float32)
        denom = tl.zeros([QUERIES * GROUP_PAD], tl.float32)
        if FIRST_PASS == 2:
            acc = tl.zeros([QUERIES * GROUP_PAD, HEAD_DIM], tl.float32)
        else:
            acc = denom
        for i0 in range(0, n_full, KEY_TILE):
            i = i0 + tokens
            offsets = kv_base + i[:, None] * stride_ks
            s = _logits(q, K, offsets, i, t, n_vis, scale_log2, cmp_len, cmp_stride, False,
                        PRECISION)
            m, denom, acc = _softmax_tile(s, V, offsets, i < n_vis, m, denom, acc,
                                          FIRST_PASS == 2, PRECISION)
        for i0 in range(n_full, n_vis, KEY_TILE):
            i = i0 + tokens
            offsets = kv_base + i[:, None] * stride_ks
            s = _logits(q, K, offsets, i, t, n_vis, scale_log2, cmp_len, cmp_stride, True,
                        PRECISION)
            m, denom, acc = _softmax_tile(s, V, offsets, i < n_vis, m, denom, acc,
                                          FIRST_PASS == 2, PRECISION)
        seen_any = denom > 0
        safe = tl.where(seen_any, denom, 1.0)
        lse2 = tl.where(seen_any, m + tl.log2(safe), float("-inf"))
        if FIRST_PASS == 2:
            o = tl.where(seen_any[:, None], acc / safe[:, None], 0.0)
            tl.store(O + q_offsets, o.to(O.dtype.element_ty), mask=row_ok[:, None])
            tl.store(LSE_OUT + stat_offsets, lse2 * 0.6931471805599453, mask=row_ok)

    if OUTPUT != 2:
        lse2 = tl.where(row_ok, lse2, float("inf"))  # padding rows: probabilities 0
        # overlap of the tile's spans with its own blocks and with the next one, over d:
        # tiles start on block boundaries, so these are the same for every tile
        blocks = tl.arange(0, TILE_BLOCKS)
        span_lo = tokens * cmp_stride
        own = _overlap(span_lo[:, None], cmp_len, blocks[None, :] * block_len,
                       block_len).to(tl.float32) / cmp_stride
        spill = _overlap(span_lo, cmp_len, TILE_BLOCKS * block_len,
                         block_len).to(tl.float32) / cmp_stride
        query_rows = tile * QUERIES + tl.arange(0, QUERIES)
        query_ok = query_rows < n_queries
        query_pos = q_start + query_rows
        out_rows = OUT + b * stride_ob + query_rows * stride_os + h * stride_oh
        carry = tl.zeros([QUERIES], tl.float32)
        running = tl.full([QUERIES, TILE_BLOCKS], -9223372036854775808, tl.int64)
        for i0 in range(0, n_full, KEY_TILE):
            i = i0 + tokens
            s = _logits(q, K, kv_base + i[:, None] * stride_ks, i, t, n_vis, scale_log2,
                        cmp_len, cmp_stride, False, PRECISION)
            carry, running = _fold_tile(tl.exp2(s - lse2[:, None]), i0 // KEY_TILE * TILE_BLOCKS,
                                        carry, running, own, spill, query_pos, query_ok,
                                        out_rows, n_blocks, block_len, QUERIES, GROUP_PAD,
                                        KEY_TILE, TILE_BLOCKS, OUTPUT)
        for i0 in range(n_full, n_vis, KEY_TILE):
            i = i0 + tokens
            s = _logits(q, K, kv_base + i[:, None] * stride_ks, i, t, n_vis, scale_log2,
                        cmp_len, cmp_stride, True, PRECISION)
            p = tl.where(s == float("-inf"), 0.0, tl.exp2(s - lse2[:, None]))
            carry, running = _fold_tile(p, i0 // KEY_TILE * TILE_BLOCKS, carry, running, own,
                                        spill, query_pos, query_ok, out_rows, n_blocks,
                                        block_len, QUERIES, GROUP_PAD, KEY_TILE, TILE_BLOCKS,
                                        OUTPUT)
        # the block the last tile's spans spill into, then blocks no visible span reaches:
        # score 0 (all blocks when writing scores; the available ones when ranking)
        written = tl.cdiv(n_vis, KEY_TILE) * TILE_BLOCKS
        if OUTPUT == 0:
            last = n_blocks + written * 0
        else:
            last = tl.minimum(t_last // block_len + 1, n_blocks)
        for j0 in range(written, last, TILE_BLOCKS):
            j = j0 + blocks
            scores = tl.where((j == written)[None, :], carry[:, None], 0.0)
            running = _emit_scores(scores, j, running, query_pos, query_ok, out_rows,
                                   n_blocks, block_len, QUERIES, TILE_BLOCKS, OUTPUT)
        if OUTPUT == 1:
            high = running >> 32
            index = 2147483647 - (running - high * 4294967296)  # from the low 32 bits
            # the list is sorted by key, best first: its first n_sel valid entries win
            best = (high > -2147483648) & (blocks[None, :] < n_sel)
            chosen = tl.where(best, index, 4611686018427387904)
            chosen = tl.sort(chosen)
            chosen = tl.where(chosen == 4611686018427387904, -1, chosen)
            tl.store(out_rows[:, None] + blocks[None, :], chosen,
                     mask=query_ok[:, None] & (blocks[None, :] < n_sel))


class _Tiles:
    """Launch constants of one call: rows, key tile and the blocks it spans."""

    def __init__(self, group: int, n_sel: int, cmp_stride: int, block_len: int):
        per_block = block_len // cmp_stride  # compressed tokens starting in one block
        self.group_pad = pow2_at_least(group, 1)
        self.queries = max(1, TILE_ROWS // self.group_pad)
        # a key tile covers whole blocks, at least n_sel of them (the running top list holds
        # as many as a tile has) and at least 16 tokens (tl.dot)
        self.tile_blocks = max(pow2_at_least(n_sel, 1), pow2_at_least(-(-16 // per_block), 1))
        self.key_tile = self.tile_blocks * per_block


def _launch(q, k_cmp, v_cmp, lse_in, o, lse_out, out, *, first_pass: int, output: int,
            q_start: int, n_queries: int, n_blocks: int, n_sel: int, cmp_len: int,
            cmp_stride: int, block_len: int, scale: float) -> None:
    """Run the kernel; q, k_cmp, v_cmp contiguous in one dtype. Tensors a mode does not
    read or write (lse_in, o, lse_out, v_cmp, and k/v_cmp before the first compressed
    token) may be None."""
    batch, _, n_q_heads, head_dim = q.shape
    n_cmp, n_kv_heads = k_cmp.shape[1], k_cmp.shape[2]
    tiles = _Tiles(n_q_heads // n_kv_heads, n_sel, cmp_stride, block_len)
    if n_queries == 0:
        return
    def stand_in(x):  # never read: a valid pointer of the right dtype
        return q if x is None or x.numel() == 0 else x
    stats = lse_in if lse_in is not None else lse_out if lse_out is not None else q[..., 0]
    grid = (triton.cdiv(n_queries, tiles.queries), batch * n_kv_heads)
    _compressed_select[grid](
        q, stand_in(k_cmp), stand_in(v_cmp), stand_in(lse_in), stand_in(o), stand_in(lse_out),
        out, q.stride(0), q.stride(1), q.stride(2),
        k_cmp.stride(0), k_cmp.stride(1), k_cmp.stride(2),
        stats.stride(0), stats.stride(1), out.stride(0), out.stride(1), out.stride(2),
        q_start, n_queries, n_cmp, n_kv_heads, n_blocks, n_sel, scale * LOG2E,
        cmp_len, cmp_stride, block_len,
        GROUP=n_q_heads // n_kv_heads, GROUP_PAD=tiles.group_pad, QUERIES=tiles.queries,
        HEAD_DIM=head_dim, KEY_TILE=tiles.key_tile, TILE_BLOCKS=tiles.tile_blocks,
        FIRST_PASS=first_pass, OUTPUT=output, PRECISION=dot_precision(q),
        num_warps=LAUNCH["num_warps"],
        num_stages=1 if q.dtype == torch.float32 else LAUNCH["num_stages"])


def _prepare(q: torch.Tensor, k_cmp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k_cmp contiguous, k_cmp in q's dtype."""
    return q.contiguous(), k_cmp.to(q.dtype).contiguous()


def block_scores(q: torch.Tensor, k_cmp: torch.Tensor, lse: torch.Tensor | None,
                 q_start: int, n_queries: int, n_blocks: int, cmp_len: int, cmp_stride: int,
                 block_len: int, scale: float) -> torch.Tensor:
    """Group block scores (Eq.8-10) of queries [q_start, q_start + n_queries).

    q [B, S, Hq, D], k_cmp [B, N, Hkv, D], lse [B, S, Hq] fp32 from the compressed branch or
    None -> fp32 [B, n_queries, Hkv, n_blocks]; blocks no visible span reaches score 0."""
    q, k_cmp = _prepare(q, k_cmp)
    out = torch.empty(q.shape[0], n_queries, k_cmp.shape[2], n_blocks, device=q.device,
                      dtype=torch.float32)
    _launch(q, k_cmp, None, None if lse is None else lse.contiguous(), None, None, out,
            first_pass=FIRST_PASS_LSE if lse is None else FIRST_PASS_NONE,
            output=OUTPUT_SCORES, q_start=q_start, n_queries=n_queries, n_blocks=n_blocks,
            n_sel=3, cmp_len=cmp_len, cmp_stride=cmp_stride, block_len=block_len,
            scale=scale)
    return out


def _empty_indices(q: torch.Tensor, n_kv_heads: int, n_sel: int) -> torch.Tensor:
    return torch.empty(q.shape[0], q.shape[1], n_kv_heads, n_sel, device=q.device,
                       dtype=torch.long)


def select_blocks(q: torch.Tensor, k_cmp: torch.Tensor, lse: torch.Tensor | None, cfg,
                  scale: float) -> torch.Tensor:
    """Block indices [B, S, Hkv, n_sel] (int64, ascending, -1 padding) as
    `nsa.ops.selection.select_blocks` defines them.

    lse: the compressed branch's log-sum-exp [B, S, Hq] (fp32), or None to compute it."""
    q, k_cmp = _prepare(q, k_cmp)
    seq = q.shape[1]
    out = _empty_indices(q, k_cmp.shape[2], cfg.n_sel)
    with torch.no_grad():
        _launch(q, k_cmp, None, None if lse is None else lse.contiguous(), None, None, out,
                first_pass=FIRST_PASS_LSE if lse is None else FIRST_PASS_NONE,
                output=OUTPUT_INDICES, q_start=0, n_queries=seq,
                n_blocks=-(-seq // cfg.l_sel), n_sel=cfg.n_sel, cmp_len=cfg.l,
                cmp_stride=cfg.d, block_len=cfg.l_sel, scale=scale)
    return out


class _CompressedAndSelection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k_cmp, v_cmp, shape, scale):
        cmp_len, cmp_stride, block_len, n_sel = shape
        check_shapes(q, k_cmp, v_cmp)
        q, k_cmp, v_cmp = q.contiguous(), k_cmp.contiguous(), v_cmp.contiguous()
        batch, seq, n_q_heads, _ = q.shape
        o = torch.empty_like(q)
        lse = torch.empty(batch, seq, n_q_heads, device=q.device, dtype=torch.float32)
        indices = _empty_indices(q, k_cmp.shape[2], n_sel)
        _launch(q, k_cmp, v_cmp, None, o, lse, indices, first_pass=FIRST_PASS_OUTPUT,
                output=OUTPUT_INDICES, q_start=0, n_queries=seq,
                n_blocks=-(-seq // block_len), n_sel=n_sel, cmp_len=cmp_len,
                cmp_stride=cmp_stride, block_len=block_len, scale=scale)
        ctx.save_for_backward(q, k_cmp, v_cmp, o, lse)
        ctx.shape, ctx.scale = shape, scale
        ctx.mark_non_differentiable(lse, indices)
        return o, lse, indices

    @staticmethod
    def backward(ctx, do, _dlse, _dindices):
        from nsa.ops.triton.band import COMPRESSED, band_backward

        q, k_cmp, v_cmp, o, lse = ctx.saved_tensors
        cmp_len, cmp_stride = ctx.shape[:2]
        dq, dk, dv = band_backward(q, k_cmp, v_cmp, o, lse, do,
                                   (COMPRESSED, cmp_len, cmp_stride), ctx.scale)
        return dq, dk, dv, None, None


def compressed_attention_and_selection(q: torch.Tensor, k_cmp: torch.Tensor,
                                       v_cmp: torch.Tensor, cfg, scale: float):
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, block indices [B, S, Hkv, n_sel] int64) of the
    compressed branch and the selection it ranks, from one kernel; o is differentiable, lse
    and the indices are not."""
    return _CompressedAndSelection.apply(q, k_cmp.to(q.dtype), v_cmp.to(q.dtype),
                                         (cfg.l, cfg.d, cfg.l_sel, cfg.n_sel), float(scale))
