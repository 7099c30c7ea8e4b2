"""Selected-block attention, memory-bounded (flash-style) torch implementation.

Layout: q [B, S, Hq, D]; k, v [B, S, Hkv, D]; block_indices [B, S, Hkv, n] int64.
Query head h reads kv head h // G with G = Hq // Hkv; the G heads of a group share the
group's selected blocks. Block j covers keys [j*block_size, (j+1)*block_size) (the last block
is partial when S is not a multiple of block_size).

block_indices[b, t, h, :] lists the selected blocks of query t, padded with -1 (entries
outside [0, ceil(S / block_size)) are ignored too). The caller guarantees that the valid
entries of a row are unique, as top-n selection never repeats a block; repeated entries give
undefined results. Query t attends key s iff s // block_size is a valid entry of its row and
s <= t, so blocks lying (partly) in the future of t are masked, and a row with no visible key
gives o = 0, lse = -inf and zero gradients.

Queries are processed in two ranges, split by shapes alone:
  dense     while a tile's causal prefix is short, t1 <= dense_factor * n * block_size, the
            tile (`query_chunk` queries) attends the contiguous keys [0, t1) with the
            selection expanded into a mask: dense matmuls are several times faster per key
            than small gathered ones, and the tile's temporaries stay O(T*G*n*block_size).
  segments  after that, (query, block) pairs are grouped by key block (segments.py), so each
            matmul is [seg*G, D] x [D, block_size] against one block read once per segment;
            cost per query is O(n * block_size), independent of S. dK/dV are accumulated
            with index_add_ (deterministic on CPU).
Both give the same numbers (up to fp32 rounding). Backward saves only q, k, v, block_indices,
the output and the fp32 log-sum-exp [B, S, Hq] and recomputes everything else tile by tile.
Compute is fp32; outputs and gradients come back in the input dtype.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from nsa.ops.torch import segments
from nsa.ops.torch._tiles import (
    check_chunk,
    check_layout,
    heads_first,
    heads_last,
    resolve_scale,
    tile_backward,
    tile_forward,
)

__all__ = ["DENSE_FACTOR", "selected_attention", "selected_attention_with_lse"]

# Measured on a 2-core CPU (fp32, D = 64, G = 4, n * block_size = 1024): a dense masked tile
# costs ~1/5 of a gathered one per key (see the module docstring).
DENSE_FACTOR = 4.0


def _to_blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, S, Hkv, D] -> fp32 [B, Hkv, S_pad, D], zero-padded to whole blocks.

    Viewed as [B*Hkv*n_blocks, block_size*D] it holds one selection block per row."""
    batch, seq, n_kv_heads, head_dim = x.shape
    n_pad = -(-seq // block_size) * block_size - seq
    return F.pad(x.float(), (0, 0, 0, 0, 0, n_pad)).transpose(1, 2).contiguous()


def _from_blocks(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Inverse of `_to_blocks`, trimmed to S and cast to `like.dtype`."""
    return x[:, :, :like.shape[1]].transpose(1, 2).to(like.dtype).contiguous()


class _Tiler:
    """Per-call state shared by the forward and backward loops over query tiles."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, indices: torch.Tensor,
                 block_size: int, query_chunk: int, dense_factor: float):
        self.batch, self.seq, self.n_q_heads, self.head_dim = q.shape
        self.n_kv_heads, self.n_sel = k.shape[2], indices.shape[-1]
        self.group = self.n_q_heads // self.n_kv_heads
        self.indices, self.block_size, self.query_chunk = indices, block_size, query_chunk
        self.n_blocks = -(-self.seq // block_size)
        dense_limit = dense_factor * self.n_sel * block_size
        # tile [t0, t0 + chunk) is dense iff it ends within the limit; segments take the rest
        self.sparse_start = self.seq if dense_limit >= self.seq else \
            int(dense_limit // query_chunk) * query_chunk

    def dense_tiles(self) -> Iterator[tuple[int, int]]:
        """(t0, t1) of the query tiles handled densely; the rest starts at sparse_start."""
        for t0 in range(0, self.sparse_start, self.query_chunk):
            yield t0, min(t0 + self.query_chunk, self.seq)

    def dense_mask(self, t0: int, t1: int) -> torch.Tensor:
        """blocked [B, Hkv, T*G, t1] over keys [0, t1): True where the key is hidden."""
        indices = self.indices[:, t0:t1]
        n_blocks = -(-t1 // self.block_size)
        valid = (indices >= 0) & (indices < n_blocks)
        picked = indices.new_zeros((*indices.shape[:3], n_blocks + 1), dtype=torch.bool)
        picked.scatter_(-1, torch.where(valid, indices, n_blocks), True)
        hidden = ~picked[..., :n_blocks].transpose(1, 2)  # [B, Hkv, T, blocks]
        hidden = hidden.repeat_interleave(self.block_size, dim=-1)[..., :t1]
        keys = torch.arange(t1, device=indices.device)
        queries = torch.arange(t0, t1, device=indices.device).unsqueeze(1)
        blocked = (hidden | (keys > queries)).unsqueeze(3)
        return blocked.expand(-1, -1, -1, self.group, -1).flatten(2, 3)


def _block_rows(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, Hkv, S_pad, D] -> view [B*Hkv*n_blocks, block_size, D], one block per row."""
    return x.view(-1, block_size, x.shape[-1])


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiler: _Tiler,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    kh, vh = _to_blocks(k, tiler.block_size), _to_blocks(v, tiler.block_size)
    o = q.new_empty(q.shape)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    for t0, t1 in tiler.dense_tiles():
        qt = heads_first(q[:, t0:t1], tiler.n_kv_heads) * scale
        ot, lt = tile_forward(qt, kh[:, :, :t1], vh[:, :, :t1], tiler.dense_mask(t0, t1))
        o[:, t0:t1] = heads_last(ot, t1 - t0)
        lse[:, t0:t1] = heads_last(lt.unsqueeze(-1), t1 - t0).squeeze(-1)
    if tiler.sparse_start < tiler.seq:
        segments.forward_range(q, _block_rows(kh, tiler.block_size),
                               _block_rows(vh, tiler.block_size), tiler.indices,
                               tiler.sparse_start, tiler.block_size, scale, o, lse)
    return o, lse


def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, do: torch.Tensor, tiler: _Tiler,
              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n_kv_heads = tiler.n_kv_heads
    kh, vh = _to_blocks(k, tiler.block_size), _to_blocks(v, tiler.block_size)
    dkh, dvh = torch.zeros_like(kh), torch.zeros_like(vh)
    dq = q.new_empty(q.shape)
    for t0, t1 in tiler.dense_tiles():
        qt = heads_first(q[:, t0:t1], n_kv_heads) * scale
        ot, dot = heads_first(o[:, t0:t1], n_kv_heads), heads_first(do[:, t0:t1], n_kv_heads)
        lt = heads_first(lse[:, t0:t1].unsqueeze(-1), n_kv_heads).squeeze(-1)
        dqt, dkt, dvt = tile_backward(qt, kh[:, :, :t1], vh[:, :, :t1],
                                      tiler.dense_mask(t0, t1), ot, dot, lt, scale)
        dq[:, t0:t1] = heads_last(dqt, t1 - t0)
        dkh[:, :, :t1] += dkt
        dvh[:, :, :t1] += dvt
    if tiler.sparse_start < tiler.seq:
        bs = tiler.block_size
        segments.backward_range(q, _block_rows(kh, bs), _block_rows(vh, bs), tiler.indices,
                                o, lse, do, tiler.sparse_start, bs, scale, dq,
                                _block_rows(dkh, bs), _block_rows(dvh, bs))
    return dq, _from_blocks(dkh, k), _from_blocks(dvh, v)


class _SelectedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                block_indices: torch.Tensor, block_size: int, scale: float, query_chunk: int,
                dense_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
        tiler = _Tiler(q, k, block_indices, block_size, query_chunk, dense_factor)
        o, lse = _forward(q, k, v, tiler, scale)
        ctx.save_for_backward(q, k, v, block_indices, o, lse)
        ctx.mark_non_differentiable(lse)
        ctx.config = (block_size, scale, query_chunk, dense_factor)
        return o, lse

    @staticmethod
    def backward(ctx, do: torch.Tensor, _dlse: torch.Tensor | None):
        q, k, v, indices, o, lse = ctx.saved_tensors
        block_size, scale, query_chunk, dense_factor = ctx.config
        tiler = _Tiler(q, k, indices, block_size, query_chunk, dense_factor)
        dq, dk, dv = _backward(q, k, v, o, lse, do, tiler, scale)
        return dq, dk, dv, None, None, None, None, None


def selected_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                block_indices: torch.Tensor, block_size: int,
                                scale: float | None = None, query_chunk: int = 128, *,
                                dense_factor: float = DENSE_FACTOR,
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, non-differentiable); see the module docstring.

    dense_factor: tiles ending at t1 <= dense_factor * n * block_size use the dense masked
    path; 0 forces the segment path everywhere, inf the dense one."""
    check_layout(q, k, v)
    batch, seq = q.shape[:2]
    if k.shape[1] != seq:
        raise ValueError(f"k: must have the query length {seq}, got {k.shape[1]}")
    if block_indices.dim() != 4 or block_indices.shape[:3] != (batch, seq, k.shape[2]):
        raise ValueError(f"block_indices: expected [B, S, Hkv, n] = [{batch}, {seq}, "
                         f"{k.shape[2]}, n], got {tuple(block_indices.shape)}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: must be a positive integer, got {block_size!r}")
    if not dense_factor >= 0:
        raise ValueError(f"dense_factor: must be >= 0, got {dense_factor!r}")
    return _SelectedAttention.apply(q, k, v, block_indices.long(), block_size,
                                    resolve_scale(q.shape[-1], scale), check_chunk(query_chunk),
                                    float(dense_factor))


def selected_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       block_indices: torch.Tensor, block_size: int, scale: float | None = None,
                       query_chunk: int = 128, *,
                       dense_factor: float = DENSE_FACTOR) -> torch.Tensor:
    """o [B, S, Hq, D] of selected-block attention; see the module docstring."""
    return selected_attention_with_lse(q, k, v, block_indices, block_size, scale, query_chunk,
                                       dense_factor=dense_factor)[0]
