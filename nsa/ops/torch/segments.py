"""Selected attention grouped by key block ("segments"): the long-prefix path of
`selected_attention` (see selected.py for the contract).

Why segments: gathering n*block_size keys for every query moves S*n*bs*D floats per kv head
through memory, and the matmuls behind it have only G rows. Here a tile of queries is turned
into (query, selected block) pairs, the pairs are sorted by block, and each block's pairs are
cut into segments of `seg` queries. One segment is a dense [seg*G, D] x [D, bs] matmul
against one key block, so each key block is read once per segment instead of once per query,
and every matmul has seg*G rows. The softmax spans all pairs of a query: segment-level
log-sum-exps are merged per query with scatter_reduce(amax) + index_add_.

Backward rebuilds the segments per tile from the saved indices and log-sum-exp; dK/dV are
accumulated per block with index_add_ (deterministic on CPU). The segment count of a tile
is read on the host once per tile: it sizes the tile's buffers.
"""

from __future__ import annotations

import math

import torch

_FLOAT_BUDGET = 1 << 24  # fp32 elements of segment logits per tile (64 MiB)


class _Tile:
    """The (query, block) pairs of the query tile [t0, t1), sorted by block and cut into
    segments. All index tensors refer to rows of the flattened tile tensors:
      q rows   [B*T*Hkv, G, D]    (query row r = (b*T + t)*Hkv + h; one extra zero row)
      key rows [B*Hkv*n_blocks, bs, D] (block key = (b*Hkv + h)*n_blocks + j)
    seg_row [n_seg, seg]: the query row of each slot (pad -> the zero row),
    seg_block [n_seg]: the block key of each segment,
    blocked [n_seg, seg, 1, bs]: True where the slot is padding or the key is after t.
    """

    def __init__(self, indices: torch.Tensor, t0: int, n_blocks: int, block_size: int,
                 seq: int, seg: int):
        batch, n_tile, n_kv_heads, n_sel = indices.shape
        device = indices.device
        self.n_rows = batch * n_tile * n_kv_heads
        valid = (indices >= 0) & (indices < n_blocks)
        heads = (torch.arange(batch, device=device).view(batch, 1, 1, 1) * n_kv_heads
                 + torch.arange(n_kv_heads, device=device).view(1, 1, n_kv_heads, 1))
        n_keys = batch * n_kv_heads * n_blocks
        key = torch.where(valid, heads * n_blocks + indices, n_keys).reshape(-1)
        row = torch.arange(self.n_rows, device=device).repeat_interleave(n_sel)
        order = torch.argsort(key, stable=True)
        key_sorted, row_sorted = key[order], row[order]
        counts = torch.bincount(key, minlength=n_keys + 1)
        first_of_key = torch.cumsum(counts, 0) - counts
        segs_per_key = (counts[:n_keys] + seg - 1) // seg
        seg_offset = torch.cumsum(segs_per_key, 0) - segs_per_key
        n_seg = int(segs_per_key.sum())
        rank = torch.arange(key.numel(), device=device) - first_of_key[key_sorted]
        real = key_sorted < n_keys
        seg_id = torch.where(real, seg_offset[key_sorted.clamp(max=n_keys - 1)] + rank // seg,
                             n_seg)
        slot = torch.where(real, rank % seg, 0)
        seg_row = torch.full((n_seg + 1, seg), self.n_rows, dtype=torch.long, device=device)
        seg_row[seg_id, slot] = torch.where(real, row_sorted, self.n_rows)
        self.seg_row = seg_row[:n_seg]
        self.seg_block = torch.repeat_interleave(
            torch.arange(n_keys, device=device), segs_per_key, output_size=n_seg)
        # positions: query t of row r is t0 + (r // Hkv) % T; key c of block j is j*bs + c
        q_pos = t0 + (self.seg_row // n_kv_heads) % n_tile
        k_pos = (self.seg_block % n_blocks).unsqueeze(1) * block_size + torch.arange(
            block_size, device=device)
        self.blocked = ((k_pos.unsqueeze(1) > q_pos.unsqueeze(2)) | (k_pos.unsqueeze(1) >= seq)
                        | (self.seg_row == self.n_rows).unsqueeze(2)).unsqueeze(2)

    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """[n_rows, G, X] -> [n_seg, seg*G, X] (padding slots read a zero row)."""
        padded = torch.cat([rows, rows.new_zeros(1, *rows.shape[1:])])
        return padded[self.seg_row].flatten(1, 2)

    def scatter_rows(self, seg_values: torch.Tensor, group: int) -> torch.Tensor:
        """[n_seg, seg*G, X] summed into [n_rows, G, X]."""
        out = seg_values.new_zeros(self.n_rows + 1, group, seg_values.shape[-1])
        out.index_add_(0, self.seg_row.reshape(-1),
                       seg_values.reshape(-1, group, seg_values.shape[-1]))
        return out[: self.n_rows]


def _rows(x: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """[B, T, Hq, ...] -> fp32 [B*T*Hkv, G, ...]."""
    batch, n_tile, n_q_heads = x.shape[:3]
    return x.float().reshape(batch * n_tile * n_kv_heads, n_q_heads // n_kv_heads, *x.shape[3:])


def _segment_lse(logits: torch.Tensor, tile: _Tile, group: int) -> torch.Tensor:
    """Per-query log-sum-exp over all its segments: logits [n_seg, seg*G, bs] -> [n_rows, G]."""
    part = torch.logsumexp(logits, dim=-1).view(-1, group)  # [n_seg*seg, G]
    index = tile.seg_row.reshape(-1, 1).expand(-1, group)
    peak = logits.new_full((tile.n_rows + 1, group), -math.inf)
    peak.scatter_reduce_(0, index, part, reduce="amax", include_self=True)
    safe_peak = peak.clamp_min(torch.finfo(torch.float32).min)
    total = logits.new_zeros(tile.n_rows + 1, group)
    total.index_add_(0, tile.seg_row.reshape(-1), torch.exp(part - safe_peak.gather(0, index)))
    return (safe_peak + total.log())[: tile.n_rows]


def _probs_(logits: torch.Tensor, lse_rows: torch.Tensor, tile: _Tile) -> torch.Tensor:
    """exp(logits - lse) in place; clamping keeps empty rows at exp(-inf) = 0, not NaN."""
    lse_seg = tile.gather_rows(lse_rows.unsqueeze(-1)).clamp_min(torch.finfo(torch.float32).min)
    return logits.sub_(lse_seg).exp_()


def _tiles(t_start: int, seq: int, n_q_heads: int, n_sel: int, block_size: int, batch: int):
    """Query tiles sized so that one tile's segment logits stay near _FLOAT_BUDGET floats;
    large tiles give each key block many queries, i.e. full segments."""
    step = max(16, _FLOAT_BUDGET // max(1, batch * n_q_heads * n_sel * block_size))
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
    for t0, t1 in _tiles(t_start, seq, n_q_heads, n_sel, block_size, batch):
        tile = _Tile(indices[:, t0:t1], t0, n_blocks, block_size, seq, seg)
        q_seg = tile.gather_rows(_rows(q[:, t0:t1], n_kv_heads))
        logits = torch.matmul(q_seg, k_blocks[tile.seg_block].transpose(1, 2)).mul_(scale)
        logits.view(-1, seg, group, block_size).masked_fill_(tile.blocked, -math.inf)
        lse_rows = _segment_lse(logits, tile, group)
        probs = _probs_(logits, lse_rows, tile)
        o_rows = tile.scatter_rows(torch.matmul(probs, v_blocks[tile.seg_block]), group)
        out[:, t0:t1] = o_rows.view(batch, t1 - t0, n_q_heads, head_dim).to(out.dtype)
        lse[:, t0:t1] = lse_rows.view(batch, t1 - t0, n_q_heads)


def backward_range(q, k_blocks, v_blocks, indices, o, lse, do, t_start, block_size, scale,
                   dq, dk_blocks, dv_blocks):
    """Fill dq[:, t_start:] and add the keys' share of queries t_start.. into dk/dv_blocks."""
    batch, seq, n_q_heads, head_dim = q.shape
    n_kv_heads, n_sel = indices.shape[2], indices.shape[-1]
    group = n_q_heads // n_kv_heads
    n_blocks = -(-seq // block_size)
    seg = _segment_size(group)
    for t0, t1 in _tiles(t_start, seq, n_q_heads, n_sel, block_size, batch):
        tile = _Tile(indices[:, t0:t1], t0, n_blocks, block_size, seq, seg)
        do_rows = _rows(do[:, t0:t1], n_kv_heads)
        delta = (do_rows * _rows(o[:, t0:t1], n_kv_heads)).sum(-1)  # [n_rows, G]
        q_seg = tile.gather_rows(_rows(q[:, t0:t1], n_kv_heads))
        do_seg = tile.gather_rows(do_rows)
        k_seg, v_seg = k_blocks[tile.seg_block], v_blocks[tile.seg_block]
        logits = torch.matmul(q_seg, k_seg.transpose(1, 2)).mul_(scale)
        logits.view(-1, seg, group, block_size).masked_fill_(tile.blocked, -math.inf)
        probs = _probs_(logits, _rows(lse[:, t0:t1], n_kv_heads), tile)
        d_scores = torch.matmul(do_seg, v_seg.transpose(1, 2))
        d_scores.sub_(tile.gather_rows(delta.unsqueeze(-1))).mul_(probs)
        dq_rows = tile.scatter_rows(torch.matmul(d_scores, k_seg), group).mul_(scale)
        dq[:, t0:t1] = dq_rows.view(batch, t1 - t0, n_q_heads, head_dim).to(dq.dtype)
        dk_blocks.index_add_(0, tile.seg_block,
                             torch.matmul(d_scores.transpose(1, 2), q_seg).mul_(scale))
        dv_blocks.index_add_(0, tile.seg_block, torch.matmul(probs.transpose(1, 2), do_seg))
