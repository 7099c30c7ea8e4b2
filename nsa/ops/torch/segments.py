"""Selected attention as a sum of small dense problems: the fast path of `selected_attention`
(see selected.py for the contract).

The keys a query t sees split into two parts with one softmax over both:
  local   its own block j = t // bs, causally (keys j*bs .. t), when the block is selected;
          all blocks at once as one causal problem per (block, kv head): [G, bs] x [bs].
  earlier the selected blocks j < t // bs, seen whole. The (query, block) pairs of a query
          tile are sorted by block and cut into segments of `seg` queries; a segment is one
          unmasked [seg*G, D] x [D, bs] problem against one block, so each block is read once
          per segment and no mask is ever built. Blocks after t // bs hold only future keys
          and are dropped.
Each problem runs through `attend_forward` (aten's fused flash kernel on the CPU) and yields
its own (o, lse); the parts of a query are merged with log-sum-exp weights. Backward hands
every problem the query's final o and lse, which makes each problem's gradients exactly its
share (split-KV), accumulated with index_add_ (deterministic on CPU).

The segment count of a tile is read on the host once per tile: it sizes the tile's buffers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nsa.ops.torch._tiles import _FP32_MIN, attend_backward, attend_forward

_FLOAT_BUDGET = 1 << 24  # fp32 elements of gathered queries per tile (64 MiB)
_TILES_PER_CALL = 8
_NO_PART = 1e30  # lse handed to a part that must contribute nothing: exp(s - 1e30) = 0


class _Pairs:
    """The earlier-block (query, block) pairs of the query tile [t0, t1), cut into segments.

    Index tensors refer to rows of flattened tile tensors:
      query rows [B*T*Hkv, G, ...]   row r = (b*T + t)*Hkv + h; row n_rows is a zero row
      key blocks [B*Hkv*n_blocks, bs, D]  block key (b*Hkv + h)*n_blocks + j
    seg_row [n_seg, seg]: the query row of each slot (padding -> the zero row);
    seg_block [n_seg]: the block key of each segment.
    """

    def __init__(self, indices: torch.Tensor, t0: int, n_blocks: int, block_size: int,
                 seg: int):
        batch, n_tile, n_kv_heads, n_sel = indices.shape
        device = indices.device
        self.n_rows = batch * n_tile * n_kv_heads
        t = torch.arange(t0, t0 + n_tile, device=device).view(1, n_tile, 1, 1)
        earlier = (indices >= 0) & (indices < t // block_size)
        heads = (torch.arange(batch, device=device).view(batch, 1, 1, 1) * n_kv_heads
                 + torch.arange(n_kv_heads, device=device).view(1, 1, n_kv_heads, 1))
        n_keys = batch * n_kv_heads * n_blocks
        key = torch.where(earlier, heads * n_blocks + indices, n_keys).reshape(-1)
        row = torch.arange(self.n_rows, device=device).repeat_interleave(n_sel)
        order = torch.argsort(key, stable=True)
        key_sorted, row_sorted = key[order], row[order]
        counts = torch.bincount(key, minlength=n_keys + 1)
        first_of_key = torch.cumsum(counts, 0) - counts
        segs_per_key = (counts[:n_keys] + seg - 1) // seg
        seg_offset = torch.cumsum(segs_per_key, 0) - segs_per_key
        self.n_seg = int(segs_per_key.sum())
        rank = torch.arange(key.numel(), device=device) - first_of_key[key_sorted]
        real = key_sorted < n_keys
        seg_id = torch.where(real, seg_offset[key_sorted.clamp(max=n_keys - 1)] + rank // seg,
                             self.n_seg)
        seg_row = torch.full((self.n_seg + 1, seg), self.n_rows, dtype=torch.long,
                             device=device)
        seg_row[seg_id, torch.where(real, rank % seg, 0)] = torch.where(real, row_sorted,
                                                                        self.n_rows)
        self.seg_row = seg_row[: self.n_seg]
        self.seg_block = torch.repeat_interleave(
            torch.arange(n_keys, device=device), segs_per_key, output_size=self.n_seg)

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """[n_rows, G, X] -> [n_seg, 1, seg*G, X] (padding slots read zeros)."""
        padded = torch.cat([rows, rows.new_zeros(1, *rows.shape[1:])])
        picked = padded.index_select(0, self.seg_row.reshape(-1))  # row copies: fast gather
        return picked.view(self.n_seg, 1, -1, rows.shape[-1])

    def blocks(self, key_blocks: torch.Tensor) -> torch.Tensor:
        """[B*Hkv*n_blocks, bs, D] -> the block of each segment, [n_seg, 1, bs, D]."""
        return key_blocks.index_select(0, self.seg_block).unsqueeze(1)

    def scatter_add(self, values: torch.Tensor, group: int) -> torch.Tensor:
        """[n_seg, 1, seg*G, X] summed per query row -> [n_rows, G, X]."""
        out = values.new_zeros(self.n_rows + 1, group, values.shape[-1])
        out.index_add_(0, self.seg_row.reshape(-1), values.reshape(-1, group, values.shape[-1]))
        return out[: self.n_rows]


def _rows(x: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """[B, T, Hq, ...] -> fp32 [B*T*Hkv, G, ...]."""
    batch, n_tile, n_q_heads = x.shape[:3]
    return x.float().reshape(batch * n_tile * n_kv_heads, n_q_heads // n_kv_heads, *x.shape[3:])


def _to_local(x: torch.Tensor, n_kv_heads: int, block_size: int) -> torch.Tensor:
    """[B, S, Hq, X] -> fp32 [B*Hkv*n_blocks, G, bs, X], zero-padded to whole blocks."""
    batch, seq, n_q_heads, width = x.shape
    n_blocks = -(-seq // block_size)
    x = F.pad(x.float(), (0, 0, 0, 0, 0, n_blocks * block_size - seq))
    x = x.view(batch, n_blocks, block_size, n_kv_heads, n_q_heads // n_kv_heads, width)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(-1, n_q_heads // n_kv_heads, block_size, width)


def _from_local(x: torch.Tensor, batch: int, seq: int, n_kv_heads: int) -> torch.Tensor:
    """Inverse of `_to_local`: [B*Hkv*n_blocks, G, bs, X] -> [B, S, Hq, X]."""
    _, group, block_size, width = x.shape
    x = x.view(batch, n_kv_heads, -1, group, block_size, width).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(batch, -1, n_kv_heads * group, width)[:, :seq]


def _has_local(indices: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, S, Hkv]: query t selected its own block t // bs."""
    t = torch.arange(indices.shape[1], device=indices.device).view(1, -1, 1, 1)
    return (indices == t // block_size).any(-1)


def _local_keys(blocks: torch.Tensor, group: int) -> torch.Tensor:
    return blocks.unsqueeze(1).expand(-1, group, -1, -1).contiguous()


def _local_forward(q, k_blocks, v_blocks, indices, block_size, scale):
    """(o [B,S,Hq,D], lse [B,S,Hq]) of the local parts; lse = -inf where not selected."""
    batch, seq, n_q_heads, _ = q.shape
    n_kv_heads = indices.shape[2]
    group = n_q_heads // n_kv_heads
    o, lse = attend_forward(_to_local(q, n_kv_heads, block_size), _local_keys(k_blocks, group),
                            _local_keys(v_blocks, group), scale, causal=True)
    o = _from_local(o, batch, seq, n_kv_heads)
    lse = _from_local(lse.unsqueeze(-1), batch, seq, n_kv_heads).squeeze(-1)
    keep = _has_local(indices, block_size).repeat_interleave(group, dim=2)
    return o.masked_fill(~keep.unsqueeze(-1), 0.0), lse.masked_fill(~keep, -math.inf)


def _merge(o_loc, lse_loc, o_seg, lse_seg, pairs: _Pairs, group: int):
    """Log-sum-exp merge of each row's local part [n_rows, G, (D)] with its segment parts
    [n_seg, 1, seg*G, (D)] -> (o [n_rows, G, D], lse [n_rows, G]); no key -> (0, -inf)."""
    index = pairs.seg_row.reshape(-1)
    part_lse = lse_seg.reshape(-1, group)
    lse_ext = torch.cat([lse_loc, lse_loc.new_full((1, group), -math.inf)])
    o_ext = torch.cat([o_loc, o_loc.new_zeros(1, *o_loc.shape[1:])])
    peak = lse_ext.scatter_reduce(0, index.unsqueeze(1).expand(-1, group), part_lse, "amax")
    peak = peak.clamp_min(_FP32_MIN)
    weight_loc = torch.exp(lse_ext - peak)
    weight_part = torch.exp(part_lse - peak[index])
    total = weight_loc.index_add(0, index, weight_part)
    o = (weight_loc.unsqueeze(-1) * o_ext).index_add_(
        0, index, weight_part.unsqueeze(-1) * o_seg.reshape(-1, group, o_seg.shape[-1]))
    o = o.div_(total.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1))
    return o[: pairs.n_rows], (peak + total.log())[: pairs.n_rows]


def _tiles(t_start: int, seq: int, n_q_heads: int, n_sel: int, head_dim: int, batch: int):
    """Query tiles of S / 8 queries, capped at _FLOAT_BUDGET floats of gathered queries.

    With T = S / 8, each of the S / bs blocks is picked by about T * n * bs / S = n * bs / 8
    queries of a tile whatever S is, so segments stay full, and temporaries grow in
    proportion to S until the cap."""
    cap = _FLOAT_BUDGET // max(1, batch * n_q_heads * n_sel * head_dim)
    step = max(16, min(cap, -(-seq // _TILES_PER_CALL)))
    return [(t0, min(t0 + step, seq)) for t0 in range(t_start, seq, step)]


def _segment_size(group: int) -> int:
    return max(8, 128 // group)


def forward_range(q, k_blocks, v_blocks, indices, t_start, block_size, scale, out, lse):
    """Fill out[:, t_start:] and lse[:, t_start:] (in place).

    q [B, S, Hq, D]; k_blocks, v_blocks fp32 [B*Hkv*n_blocks, bs, D]; indices [B, S, Hkv, n].
    """
    batch, seq, n_q_heads, head_dim = q.shape
    n_kv_heads, n_sel = indices.shape[2], indices.shape[-1]
    group = n_q_heads // n_kv_heads
    n_blocks = -(-seq // block_size)
    seg = _segment_size(group)
    o_loc, lse_loc = _local_forward(q, k_blocks, v_blocks, indices, block_size, scale)
    for t0, t1 in _tiles(t_start, seq, n_q_heads, n_sel, head_dim, batch):
        o_rows, lse_rows = _rows(o_loc[:, t0:t1], n_kv_heads), _rows(lse_loc[:, t0:t1], n_kv_heads)
        pairs = _Pairs(indices[:, t0:t1], t0, n_blocks, block_size, seg)
        if pairs.n_seg:
            o_seg, lse_seg = attend_forward(pairs.gather(_rows(q[:, t0:t1], n_kv_heads)),
                                            pairs.blocks(k_blocks), pairs.blocks(v_blocks),
                                            scale, causal=False)
            o_rows, lse_rows = _merge(o_rows, lse_rows, o_seg, lse_seg, pairs, group)
        out[:, t0:t1] = o_rows.view(batch, t1 - t0, n_q_heads, head_dim).to(out.dtype)
        lse[:, t0:t1] = lse_rows.view(batch, t1 - t0, n_q_heads)


def _local_backward(q, k_blocks, v_blocks, indices, o, lse, do, t_start, block_size, scale,
                    dk_blocks, dv_blocks) -> torch.Tensor:
    """Local parts' dq [B, S, Hq, D] (fp32); their dk/dv are added to the block buffers.
    Queries before t_start and queries without their local block contribute nothing."""
    batch, seq, n_q_heads, _ = q.shape
    n_kv_heads = indices.shape[2]
    group = n_q_heads // n_kv_heads
    keep = _has_local(indices, block_size).repeat_interleave(group, dim=2)
    keep[:, :t_start] = False
    lse_used = torch.where(keep, lse, _NO_PART)
    lse_local = _to_local(lse_used.unsqueeze(-1), n_kv_heads, block_size).squeeze(-1)
    lse_local[_to_local(keep.unsqueeze(-1).float(), n_kv_heads, block_size).squeeze(-1) == 0] \
        = _NO_PART  # padding rows of a partial last block too
    do_kept = do.float() * keep.unsqueeze(-1)
    dq, dk, dv = attend_backward(_to_local(do_kept, n_kv_heads, block_size),
                                 _to_local(q, n_kv_heads, block_size),
                                 _local_keys(k_blocks, group), _local_keys(v_blocks, group),
                                 _to_local(o, n_kv_heads, block_size), lse_local.contiguous(),
                                 scale, causal=True)
    dk_blocks.add_(dk.sum(1))
    dv_blocks.add_(dv.sum(1))
    return _from_local(dq, batch, seq, n_kv_heads)


def backward_range(q, k_blocks, v_blocks, indices, o, lse, do, t_start, block_size, scale,
                   dq, dk_blocks, dv_blocks):
    """Fill dq[:, t_start:] and add the keys' share of queries t_start.. into dk/dv_blocks."""
    batch, seq, n_q_heads, head_dim = q.shape
    n_kv_heads, n_sel = indices.shape[2], indices.shape[-1]
    group = n_q_heads // n_kv_heads
    n_blocks = -(-seq // block_size)
    seg = _segment_size(group)
    dq_loc = _local_backward(q, k_blocks, v_blocks, indices, o, lse, do, t_start, block_size,
                             scale, dk_blocks, dv_blocks)
    for t0, t1 in _tiles(t_start, seq, n_q_heads, n_sel, head_dim, batch):
        dq_rows = _rows(dq_loc[:, t0:t1], n_kv_heads)
        pairs = _Pairs(indices[:, t0:t1], t0, n_blocks, block_size, seg)
        if pairs.n_seg:
            lse_rows = _rows(lse[:, t0:t1], n_kv_heads)
            lse_rows = torch.where(torch.isneginf(lse_rows), 0.0, lse_rows)
            k_seg, v_seg = pairs.blocks(k_blocks), pairs.blocks(v_blocks)
            dq_seg, dk_seg, dv_seg = attend_backward(
                pairs.gather(_rows(do[:, t0:t1], n_kv_heads)),
                pairs.gather(_rows(q[:, t0:t1], n_kv_heads)), k_seg, v_seg,
                pairs.gather(_rows(o[:, t0:t1], n_kv_heads)),
                pairs.gather(lse_rows.unsqueeze(-1)).squeeze(-1), scale, causal=False)
            dq_rows = dq_rows + pairs.scatter_add(dq_seg, group)
            dk_blocks.index_add_(0, pairs.seg_block, dk_seg.squeeze(1))
            dv_blocks.index_add_(0, pairs.seg_block, dv_seg.squeeze(1))
        dq[:, t0:t1] = dq_rows.view(batch, t1 - t0, n_q_heads, head_dim).to(dq.dtype)
