"""Selected attention past the dense range, block by block: the sparse path of
`selected_attention` (see selected.py for the contract).

Queries are taken in tiles [t0, t1) of whole selection blocks (t0 a multiple of bs). Inside a
tile the rows are kv-head major, row r = (b*Hkv + h)*T_pad + (t - t0), each holding the G
query heads of the group, so the queries of one block form a contiguous [bs*G, D] slab.
The keys query t sees split into
  local    its own block t // bs, causally, when it is selected: one [bs*G, D] x [D, bs]
           problem per (block, kv head) of the tile, read straight from the slab;
  earlier  its selected blocks j < t // bs, seen whole. The (query, block) pairs of the tile
           are grouped by block: block j with c_j queries is one unmasked
           [m*G, D] x [D, bs] problem against that block, its c_j query rows gathered and
           padded to m >= c_j. Blocks are taken in order of decreasing c_j and batched into
           chunks that share one m (the chunk's largest c_j, rounded up), so padding stays
           small, each block's keys are read once per tile and no mask is built. Blocks
           after t // bs hold only future keys and are dropped.
One softmax spans both parts. No chunk's temporaries exceed `_CHUNK_FLOATS`. When
`nsa.ops.shift` bounds every logit of the call (`unshifted`, the common case) the logits are
exponentiated as they are: each chunk is a matmul, an exp pass and a matmul whose products
are summed into the tile's numerator and denominator. Otherwise the tile keeps a running
row maximum M, and when a chunk raises M the accumulated numerator and denominator are
rescaled once (online softmax over chunks, never over single pairs). Either way every pair
is exponentiated once and multiplied into V by one batched matmul.

Backward gets the final lse and delta = rowsum(dO * O) of each query and needs no merge at
all: every pair's probabilities are exp(s - lse) (under `unshifted`, s - lse stays above
exp's denormal range, so it needs no floor), its dQ rows are summed per query with
index_add_ (chunks and rows in a fixed order: deterministic on CPU), and each block's dK/dV
comes from one problem. The tile's block counts are read on the host once per tile: they
size the chunks.
"""

from __future__ import annotations

import math

import torch

from nsa.ops.shift import EXP_FLOOR
from nsa.ops.torch._tiles import _FP32_MIN
from nsa.ops.workspace import Workspace

_CHUNK_FLOATS = 1 << 20  # fp32 elements of one chunk's largest temporary (4 MiB)
_TILES_PER_CALL = 8
_ROW_ALIGN = 8  # a chunk's queries per block are a multiple of this
_MIN_FILL = 0.875  # a block joins a chunk only if its pairs fill this share of the slots


def tiles(t_start: int, seq: int, block_size: int) -> list[tuple[int, int]]:
    """Query tiles of about S / 8 queries, whole blocks, from t_start (a multiple of bs).

    With T = S / 8 each of the S / bs blocks is picked by about T * n * bs / S = n * bs / 8
    queries of a tile whatever S is, so the per-block problems stay large."""
    step = max(1, -(-seq // (_TILES_PER_CALL * block_size))) * block_size
    return [(t0, min(t0 + step, seq)) for t0 in range(t_start, seq, step)]


class _Tile:
    """Layout and pairs of the query tile [t0, t1).

    rows [n_rows + 1, G, ...] tensors: kv-head-major rows (module docstring); row n_rows
    is a zero row that padding slots read.
    chunks: list of (rows [n, m], keys [n]): the query row of each of the m slots of each of
    n blocks (padding -> n_rows), and the key-block row, (b*Hkv + h)*n_blocks + j, of each
    block. keep [n_rows]: the query selected its own block (and exists: rows past S are
    padding).
    """

    def __init__(self, indices: torch.Tensor, t0: int, t1: int, block_size: int, group: int,
                 head_dim: int):
        batch, seq, n_kv_heads, _ = indices.shape
        device = indices.device
        self.t0, self.t1, self.n_tile = t0, t1, t1 - t0
        self.batch, self.n_kv_heads, self.group = batch, n_kv_heads, group
        self.block_size = block_size
        self.c0, self.n_local = t0 // block_size, -(-self.n_tile // block_size)
        self.t_pad = self.n_local * block_size
        self.n_rows = batch * n_kv_heads * self.t_pad
        self.n_blocks = -(-seq // block_size)
        tile_idx = indices[:, t0:t1]
        own = (torch.arange(t0, t1, device=device) // block_size).view(1, -1, 1, 1)
        keep = (tile_idx == own).any(-1).transpose(1, 2)  # [B, Hkv, T]
        self.keep = self._pad_rows(keep, False).reshape(self.n_rows)
        self.chunks = self._pair_chunks(tile_idx, own, group * max(block_size, head_dim))

    def _pad_rows(self, x: torch.Tensor, value) -> torch.Tensor:
        """[B, Hkv, T, ...] -> [B, Hkv, T_pad, ...] padded with `value`."""
        pad = x.new_full((*x.shape[:2], self.t_pad - self.n_tile, *x.shape[3:]), value)
        return torch.cat([x, pad], dim=2)

    def _pair_chunks(self, tile_idx: torch.Tensor, own: torch.Tensor,
                     width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The chunks of the earlier-block pairs; width: floats per slot of a temporary."""
        batch, n_tile, n_kv_heads, n_sel = tile_idx.shape
        device = tile_idx.device
        earlier = (tile_idx >= 0) & (tile_idx < own)
        bh = (torch.arange(batch, device=device).view(batch, 1, 1, 1) * n_kv_heads
              + torch.arange(n_kv_heads, device=device).view(1, 1, n_kv_heads, 1))
        n_keys = batch * n_kv_heads * self.n_blocks
        key = torch.where(earlier, bh * self.n_blocks + tile_idx, n_keys).reshape(-1)
        row = (bh * self.t_pad + torch.arange(n_tile, device=device).view(1, -1, 1, 1))
        row = row.expand(batch, n_tile, n_kv_heads, n_sel).reshape(-1)
        # stable: the pairs of a block keep ascending rows, so every sum has a fixed order
        order = torch.argsort(key, stable=True)
        key_sorted, row_sorted = key[order], row[order]
        counts = torch.bincount(key, minlength=n_keys + 1)[:n_keys]
        by_count = torch.argsort(counts, descending=True, stable=True)
        sorted_counts = counts[by_count].tolist()  # the host read that sizes the chunks
        plan, slot_start = _plan_chunks(sorted_counts, width)
        if not plan:
            return []
        n_pairs = sum(sorted_counts)
        position = torch.empty_like(by_count)
        position[by_count] = torch.arange(n_keys, device=device)
        first_pair = torch.cumsum(counts, 0) - counts
        key_sorted, row_sorted = key_sorted[:n_pairs], row_sorted[:n_pairs]
        rank = torch.arange(n_pairs, device=device) - first_pair[key_sorted]
        starts = torch.tensor(slot_start, dtype=torch.long, device=device)
        slot = starts[position[key_sorted]] + rank
        slot_row = torch.full((plan[-1][0] + plan[-1][2] * plan[-1][3],), self.n_rows,
                              dtype=torch.long, device=device)
        slot_row.index_put_((slot,), row_sorted)
        return [(slot_row[base:base + n * m].view(n, m), by_count[first:first + n])
                for base, first, n, m in plan]

    def rows(self, x: torch.Tensor, ws: Workspace, name: str,
             scale: float = 1.0) -> torch.Tensor:
        """[B, S, Hq, X...] -> fp32 [n_rows + 1, G, X...] of this tile in workspace buffer
        `name`, times `scale`, with zeros in the padding rows and the extra row."""
        tail = x.shape[3:]
        out = ws.take(name, self.n_rows + 1, self.group, *tail).zero_()
        view = out[: self.n_rows].view(self.batch, self.n_kv_heads, self.t_pad, self.group, *tail)
        part = x[:, self.t0:self.t1].unflatten(2, (self.n_kv_heads, self.group))
        view[:, :, : self.n_tile] = part.transpose(1, 2)
        return out.mul_(scale) if scale != 1.0 else out

    def unrows(self, x: torch.Tensor) -> torch.Tensor:
        """Inverse of `rows`: [n_rows (+ 1), G, X...] -> [B, T, Hq, X...]."""
        tail = x.shape[2:]
        x = x[: self.n_rows].view(self.batch, self.n_kv_heads, self.t_pad, self.group, *tail)
        return x[:, :, : self.n_tile].transpose(1, 2).flatten(2, 3)

    def local_keys(self, blocks: torch.Tensor) -> torch.Tensor:
        """[B*Hkv*n_blocks, bs, D] -> the tile's own blocks [B*Hkv*n_local, bs, D]."""
        view = blocks.view(self.batch, self.n_kv_heads, self.n_blocks, *blocks.shape[1:])
        return view[:, :, self.c0:self.c0 + self.n_local].reshape(-1, *blocks.shape[1:])

    def local_blocked(self) -> torch.Tensor:
        """[B*Hkv*n_local, bs*G, bs] bool, True where a local key is hidden: after the
        query, or the query did not select its own block (or is padding)."""
        bs, group = self.block_size, self.group
        pos = torch.arange(bs, device=self.keep.device)
        future = (pos.view(1, -1) > pos.view(-1, 1)).repeat_interleave(group, dim=0)
        hidden = ~self.keep.view(-1, bs).repeat_interleave(group, dim=1)
        return future.unsqueeze(0) | hidden.unsqueeze(-1)


def _plan_chunks(counts: list[int], width: int) -> tuple[list[tuple[int, int, int, int]],
                                                        list[int]]:
    """Chunks of blocks sorted by decreasing pair count: (first slot, first block, blocks n,
    slots per block m) each, and the first slot of every block with pairs.

    A chunk starts at the largest remaining count, rounded up to _ROW_ALIGN, and takes the
    next blocks while n * m * width stays within _CHUNK_FLOATS and their counts fill at
    least _MIN_FILL of m (at least one block)."""
    plan, slot_start, base, first = [], [], 0, 0
    n_active = sum(1 for c in counts if c)
    while first < n_active:
        m = -(-counts[first] // _ROW_ALIGN) * _ROW_ALIGN
        last = min(n_active, first + max(1, _CHUNK_FLOATS // (m * width)))
        n = 1
        while first + n < last and counts[first + n] >= _MIN_FILL * m:
            n += 1
        plan.append((base, first, n, m))
        slot_start += range(base, base + n * m, m)
        base, first = base + n * m, first + n
    return plan, slot_start


def _exp_shifted(logits: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """exp(logits - shift) in place, shift broadcast over the last dimension."""
    return logits.sub_(shift.unsqueeze(-1)).clamp_min_(EXP_FLOOR).exp_()


def _gather(rows_ext: torch.Tensor, slot_rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """[n_rows + 1, G, X] -> [blocks, slots*G, X] into `out` (row copies: a fast gather)."""
    n, m = slot_rows.shape
    out = out.view(n * m, *rows_ext.shape[1:])
    torch.index_select(rows_ext, 0, slot_rows.reshape(-1), out=out)
    return out.view(n, -1, rows_ext.shape[-1])


def _blocks(blocks: torch.Tensor, keys: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The blocks named by `keys` [n] of blocks [B*Hkv*n_blocks, X, Y] -> `out` [n, X, Y]."""
    return torch.index_select(blocks, 0, keys, out=out)


def _forward_tile(tile: _Tile, q_rows: torch.Tensor, kt_blocks: torch.Tensor,
                  v_blocks: torch.Tensor, ws: Workspace) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [n_rows, G, D], lse [n_rows, G]) of one tile; q_rows pre-scaled, from `rows`;
    kt_blocks [B*Hkv*n_blocks, D, bs] (keys transposed), v_blocks [B*Hkv*n_blocks, bs, D]."""
    group, n_rows = tile.group, tile.n_rows
    logits_loc, blocked, v_loc = _local_logits(tile, q_rows, kt_blocks, v_blocks, ws)
    logits_loc.masked_fill_(blocked, -math.inf)
    peak = torch.cat([logits_loc.amax(-1).view(n_rows, group),
                      logits_loc.new_full((1, group), -math.inf)])
    o = total = None
    for rows, keys in tile.chunks:
        flat = rows.reshape(-1)
        logits = _chunk_logits(q_rows, kt_blocks, rows, keys, ws)
        new_peak = peak.scatter_reduce(0, flat.unsqueeze(1).expand(-1, group),
                                       logits.amax(-1).view(-1, group), "amax")
        if o is None:  # the local part waits for the first chunk's maxima: no rescale
            o, total = _local_forward(logits_loc, blocked, v_loc, new_peak, n_rows, ws)
        else:
            factor = torch.exp(peak.clamp_min(_FP32_MIN) - new_peak.clamp_min(_FP32_MIN))
            o.mul_(factor.unsqueeze(-1))
            total.mul_(factor)
        peak = new_peak
        shift = peak.clamp_min(_FP32_MIN).index_select(0, flat).view(logits.shape[:2])
        _add_chunk(_exp_shifted(logits, shift), v_blocks, rows, keys, o, total, ws)
    if o is None:
        o, total = _local_forward(logits_loc, blocked, v_loc, peak, n_rows, ws)
    o, lse = _normalized(o, total, n_rows)
    return o, lse.add_(peak[:n_rows])  # rows without keys: log 0 + -inf = -inf


def _forward_tile_unshifted(tile: _Tile, q_rows: torch.Tensor, kt_blocks: torch.Tensor,
                            v_blocks: torch.Tensor,
                            ws: Workspace) -> tuple[torch.Tensor, torch.Tensor]:
    """`_forward_tile` for a call whose logits `nsa.ops.shift` found small enough to
    exponentiate as they are: no row maxima, so each chunk is one pass of exp between its
    two matmuls and nothing is rescaled."""
    logits_loc, blocked, v_loc = _local_logits(tile, q_rows, kt_blocks, v_blocks, ws)
    o, total = _local_forward(logits_loc, blocked, v_loc, None, tile.n_rows, ws)
    for rows, keys in tile.chunks:
        probs = _chunk_logits(q_rows, kt_blocks, rows, keys, ws).exp_()
        _add_chunk(probs, v_blocks, rows, keys, o, total, ws)
    return _normalized(o, total, tile.n_rows)


def _local_logits(tile: _Tile, q_rows, kt_blocks, v_blocks, ws: Workspace):
    """The tile's own blocks: logits [B*Hkv*n_local, bs*G, bs] (buffer "local"), their mask
    (True = hidden) and values [B*Hkv*n_local, bs, D]."""
    kt_loc, v_loc = tile.local_keys(kt_blocks), tile.local_keys(v_blocks)
    q_loc = q_rows[:tile.n_rows].view(kt_loc.shape[0], -1, q_rows.shape[-1])
    logits = torch.bmm(q_loc, kt_loc, out=ws.take("local", *q_loc.shape[:2], kt_loc.shape[-1]))
    return logits, tile.local_blocked(), v_loc


def _local_forward(logits_loc, blocked, v_loc, peak, n_rows, ws: Workspace):
    """Numerator [n_rows + 1, G, D] and denominator [n_rows + 1, G] of the local parts,
    exponentiated against the row maxima `peak` (None: as they are); consumes logits_loc."""
    group = logits_loc.shape[0] * logits_loc.shape[1] // n_rows
    if peak is None:
        probs = logits_loc.exp_()
    else:
        probs = _exp_shifted(logits_loc,
                             peak[:n_rows].clamp_min(_FP32_MIN).view(logits_loc.shape[:2]))
    probs.masked_fill_(blocked, 0.0)
    total = torch.cat([probs.sum(-1).view(n_rows, group), probs.new_zeros(1, group)])
    o = ws.take("o", n_rows + 1, group, v_loc.shape[-1])
    torch.bmm(probs, v_loc, out=o[:n_rows].view(*probs.shape[:2], -1))
    o[n_rows] = 0.0
    return o, total


def _chunk_logits(q_rows: torch.Tensor, kt_blocks: torch.Tensor, rows: torch.Tensor,
                  keys: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """q.k of a chunk's slots against their blocks: [n, m*G, bs] (buffer "logits")."""
    (n, m), (_, group, head_dim) = rows.shape, q_rows.shape
    block_size = kt_blocks.shape[-1]
    return torch.bmm(_gather(q_rows, rows, ws.take("pairs", n, m * group, head_dim)),
                     _blocks(kt_blocks, keys, ws.take("keys", n, head_dim, block_size)),
                     out=ws.take("logits", n, m * group, block_size))


def _add_chunk(probs: torch.Tensor, v_blocks: torch.Tensor, rows: torch.Tensor,
               keys: torch.Tensor, o: torch.Tensor, total: torch.Tensor,
               ws: Workspace) -> None:
    """Add a chunk's probabilities [n, m*G, bs] into the tile's denominator total
    [n_rows + 1, G] and, times the blocks' values, into its numerator o [n_rows + 1, G, D]."""
    (n, m), (_, group, head_dim) = rows.shape, o.shape
    flat = rows.reshape(-1)
    total.index_add_(0, flat, probs.sum(-1).view(-1, group))
    values = _blocks(v_blocks, keys, ws.take("keys", n, v_blocks.shape[1], head_dim))
    part = torch.bmm(probs, values, out=ws.take("pairs", n, m * group, head_dim))
    o.index_add_(0, flat, part.view(-1, group, head_dim))


def _normalized(o: torch.Tensor, total: torch.Tensor,
                n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(o / total [n_rows, G, D], log(total) [n_rows, G]): rows without keys give o = 0 and
    log 0 = -inf."""
    o, total = o[:n_rows], total[:n_rows]
    o.div_(total.clamp_min(torch.finfo(torch.float32).tiny).unsqueeze(-1))
    return o, total.log()


def forward_range(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor,
                  indices: torch.Tensor, t_start: int, block_size: int, scale: float,
                  unshifted: bool, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Fill out[:, t_start:] and lse[:, t_start:] in place (t_start a multiple of bs).

    q [B, S, Hq, D]; k_blocks, v_blocks fp32 [B*Hkv*n_blocks, bs, D]; indices [B, S, Hkv, n]
    without repeats in a row; unshifted: `nsa.ops.shift.unshifted_exp_is_safe` of q and k."""
    group = q.shape[2] // indices.shape[2]
    kt_blocks = k_blocks.transpose(1, 2).contiguous()  # contiguous operands: faster bmm
    ws = Workspace(q.device)
    tile_forward = _forward_tile_unshifted if unshifted else _forward_tile
    for t0, t1 in tiles(t_start, q.shape[1], block_size):
        tile = _Tile(indices, t0, t1, block_size, group, q.shape[-1])
        o_rows, lse_rows = tile_forward(tile, tile.rows(q, ws, "q", scale), kt_blocks,
                                        v_blocks, ws)
        out[:, t0:t1] = tile.unrows(o_rows)
        lse[:, t0:t1] = tile.unrows(lse_rows)


def _backward_tile(tile: _Tile, q_rows, do_rows, lse_rows, delta_rows, blocks,
                   dk_blocks, dv_blocks, ws: Workspace, floor: float | None) -> torch.Tensor:
    """dq rows [n_rows, G, D] (before the softmax scale) of one tile; dK/dV added to the
    block buffers. blocks = (k, k transposed, v transposed) block tensors; floor: the lowest
    exponent kept (None: no floor needed). Padding and the extra row hold q = dO = delta = 0:
    they contribute 0."""
    group, head_dim, n_rows = tile.group, q_rows.shape[-1], tile.n_rows
    shift = torch.where(torch.isneginf(lse_rows), math.inf, lse_rows)  # empty rows -> p = 0
    k_loc, kt_loc, vt_loc = (tile.local_keys(x) for x in blocks)
    n_loc = k_loc.shape[0]
    q_loc = q_rows[:n_rows].view(n_loc, -1, head_dim)
    do_loc = do_rows[:n_rows].view(n_loc, -1, head_dim)
    probs = _probs(q_loc, kt_loc, shift[:n_rows].view(n_loc, -1, 1), floor,
                   ws.take("local", *q_loc.shape[:2], kt_loc.shape[-1]))
    probs.masked_fill_(tile.local_blocked(), 0.0)
    dv_loc = torch.bmm(probs.transpose(1, 2), do_loc)
    d_scores = _score_grads(do_loc, vt_loc, delta_rows[:n_rows].view(n_loc, -1, 1), probs,
                            ws.take("local_scores", *probs.shape))
    dq_rows = ws.take("dq", *q_rows.shape)
    torch.bmm(d_scores, k_loc, out=dq_rows[:n_rows].view(n_loc, -1, head_dim))
    dq_rows[n_rows] = 0.0
    dk_loc = torch.bmm(d_scores.transpose(1, 2), q_loc)
    for grads, part in ((dk_blocks, dk_loc), (dv_blocks, dv_loc)):
        view = grads.view(tile.batch, tile.n_kv_heads, tile.n_blocks, *grads.shape[1:])
        view[:, :, tile.c0:tile.c0 + tile.n_local] += part.view(
            tile.batch, tile.n_kv_heads, tile.n_local, *grads.shape[1:])
    bs = tile.block_size
    for rows, keys in tile.chunks:
        flat = rows.reshape(-1)
        n, m = rows.shape
        q_pairs = _gather(q_rows, rows, ws.take("pairs", n, m * group, head_dim))
        do_pairs = _gather(do_rows, rows, ws.take("pairs_do", n, m * group, head_dim))
        k, kt, vt = (_blocks(x, keys, ws.take(name, n, *x.shape[1:]))
                     for x, name in zip(blocks, ("keys", "keys_t", "values_t"), strict=True))
        shift_pairs = shift.index_select(0, flat).view(n, m * group, 1)
        probs = _probs(q_pairs, kt, shift_pairs, floor, ws.take("logits", n, m * group, bs))
        dv_blocks.index_add_(0, keys, torch.bmm(probs.transpose(1, 2), do_pairs,
                                                out=ws.take("dkv", n, bs, head_dim)))
        delta = delta_rows.index_select(0, flat).view(n, m * group, 1)
        d_scores = _score_grads(do_pairs, vt, delta, probs, ws.take("scores", n, m * group, bs))
        dq_part = torch.bmm(d_scores, k, out=ws.take("pairs_do", n, m * group, head_dim))
        dq_rows.index_add_(0, flat, dq_part.view(-1, group, head_dim))
        dk_blocks.index_add_(0, keys, torch.bmm(d_scores.transpose(1, 2), q_pairs,
                                                out=ws.take("dkv", n, bs, head_dim)))
    return dq_rows[:n_rows]


def _probs(q: torch.Tensor, kt: torch.Tensor, lse: torch.Tensor, floor: float | None,
           out: torch.Tensor) -> torch.Tensor:
    """exp(max(q kt - lse, floor)): [N, M, D] x [N, D, K] with lse [N, M, 1] -> [N, M, K]
    into `out` (floor None: no clamp)."""
    logits = torch.baddbmm(lse, q, kt, beta=-1.0, out=out)
    return (logits if floor is None else logits.clamp_min_(floor)).exp_()


def _score_grads(do: torch.Tensor, vt: torch.Tensor, delta: torch.Tensor,
                 probs: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """dS = P * (dO V^T - delta): [N, M, K] (into `out`)."""
    scores = torch.baddbmm(delta, do, vt, beta=-1.0, out=out) if out is not None else \
        torch.baddbmm(delta, do, vt, beta=-1.0)
    return scores.mul_(probs)


def _row_dots(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """fp32 <x, y> over the last dimension: [B, T, H, D] x [B, T, H, D] -> [B, T, H] (as a
    batched matrix product: no [B, T, H, D] temporary)."""
    width = x.shape[-1]
    return torch.bmm(x.float().reshape(-1, 1, width),
                     y.float().reshape(-1, width, 1)).view(x.shape[:-1])


def backward_range(q, k_blocks, v_blocks, indices, o, lse, do, t_start, block_size, scale,
                   unshifted, dq, dk_blocks, dv_blocks) -> None:
    """Fill dq[:, t_start:] and add the keys' share of queries t_start.. into dk/dv_blocks
    (fp32 [B*Hkv*n_blocks, bs, D]); unshifted as for `forward_range`."""
    group = q.shape[2] // indices.shape[2]
    blocks = (k_blocks, k_blocks.transpose(1, 2).contiguous(),
              v_blocks.transpose(1, 2).contiguous())
    ws = Workspace(q.device)
    delta_all = _row_dots(do, o)  # [B, S, Hq]; the tiles read rows t_start..
    for t0, t1 in tiles(t_start, q.shape[1], block_size):
        tile = _Tile(indices, t0, t1, block_size, group, q.shape[-1])
        do_rows = tile.rows(do, ws, "do")
        delta = tile.rows(delta_all, ws, "delta")
        lse_rows = tile.rows(lse, ws, "lse")
        lse_rows[tile.n_rows:] = math.inf  # the extra row: p = 0 against it
        dq_rows = _backward_tile(tile, tile.rows(q, ws, "q", scale), do_rows, lse_rows, delta,
                                 blocks, dk_blocks, dv_blocks, ws,
                                 None if unshifted else EXP_FLOOR)
        dq[:, t0:t1] = tile.unrows(dq_rows.mul_(scale))
