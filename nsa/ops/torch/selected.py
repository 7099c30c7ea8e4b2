"""Selected-block attention, memory-bounded (flash-style) torch implementation.

Layout: q [B, S, Hq, D]; k, v [B, S, Hkv, D]; block_indices [B, S, Hkv, n] int64.
Query head h reads kv head h // G with G = Hq // Hkv; the G heads of a group share the
group's selected blocks. Block j covers keys [j*block_size, (j+1)*block_size) (the last block
is partial when S is not a multiple of block_size).

block_indices[b, t, h, :] lists the selected blocks of query t, padded with -1 (entries
outside [0, ceil(S / block_size)) are ignored too). A block listed more than once in a row is
attended once (`nsa.ops.indices.unique_block_indices`, the rule of every backend). Query t
attends key s iff s // block_size is a valid entry of its row and s <= t, so blocks lying
(partly) in the future of t are masked, and a row with no visible key gives o = 0,
lse = -inf and zero gradients.

Queries are processed in two ranges, split by shapes alone:
  dense     queries t < sparse_start, where sparse_start = dense_factor * n * block_size
            rounded down to whole blocks: each tile (`query_chunk` queries) attends the
            contiguous keys [0, t1) with the selection expanded into a mask. While the causal
            prefix is short, one dense problem (on the CPU aten's fused flash kernel, the one
            SDPA runs) beats gathering; temporaries stay O(T*G*dense_factor*n*block_size).
  sparse    the rest, block by block (selected_blocks.py): each block is multiplied against the
            queries that selected it, one softmax per query across its blocks; cost per
            query is O(n * block_size), independent of S. dK/dV are accumulated with
            index_add_ (deterministic on CPU). The logits are exponentiated without a row
            maximum when `nsa.ops.shift` bounds them all (decided once per call).
Both give the same numbers (up to fp32 rounding). Backward saves only q, k, v, block_indices,
the output and the fp32 log-sum-exp [B, S, Hq] and recomputes everything else tile by tile.
Compute is fp32; outputs and gradients come back in the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from nsa.ops import shift
from nsa.ops.indices import unique_block_indices
from nsa.ops.torch import selected_blocks
from nsa.ops.torch._tiles import (
    _CPU_FLASH,
    _CPU_FLASH_BACKWARD,
    check_chunk,
    check_layout,
    heads_first,
    heads_last,
    resolve_scale,
    tile_backward,
    tile_forward,
    use_fused_kernel,
)

__all__ = ["DENSE_FACTOR", "selected_attention", "selected_attention_with_lse"]

# Below t = n * block_size a query can see at most n blocks, so top-n selection takes them
# all and the dense mask hides nothing that is not in the future: no wasted work. Measured
# on a 2-core CPU (fp32, D = 64, G = 4, n * block_size = 1024), factors 0, 1 and 2 cost the
# same at S = 16k; 3 costs more.
DENSE_FACTOR = 1.0


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
        dense_limit = dense_factor * self.n_sel * block_size
        # the sparse path takes whole blocks, so its range starts on a block boundary
        self.sparse_start = self.seq if dense_limit >= self.seq else \
            int(dense_limit // block_size) * block_size

    def dense_tiles(self) -> Iterator[tuple[int, int]]:
        """(t0, t1) of the query tiles handled densely; the rest starts at sparse_start."""
        for t0 in range(0, self.sparse_start, self.query_chunk):
            yield t0, min(t0 + self.query_chunk, self.sparse_start)

    def dense_blocked(self, t0: int, t1: int) -> torch.Tensor:
        """[B, Hkv, T, t1] bool over keys [0, t1): True where the key is hidden."""
        indices = self.indices[:, t0:t1]
        n_blocks = -(-t1 // self.block_size)
        valid = (indices >= 0) & (indices < n_blocks)
        picked = indices.new_zeros((*indices.shape[:3], n_blocks + 1), dtype=torch.bool)
        picked.scatter_(-1, torch.where(valid, indices, n_blocks), True)
        hidden = ~picked[..., :n_blocks].transpose(1, 2)  # [B, Hkv, T, blocks]
        hidden = hidden.repeat_interleave(self.block_size, dim=-1)[..., :t1]
        keys = torch.arange(t1, device=indices.device)
        queries = torch.arange(t0, t1, device=indices.device).unsqueeze(1)
        return hidden | (keys > queries)

    def group_blocked(self, blocked: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, T, K] -> [B, Hkv, T*G, K] in the row order of `heads_first`."""
        return blocked.unsqueeze(3).expand(-1, -1, -1, self.group, -1).flatten(2, 3)


def _block_rows(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, Hkv, S_pad, D] -> view [B*Hkv*n_blocks, block_size, D], one block per row."""
    return x.view(-1, block_size, x.shape[-1])


def _fused_inputs(q, kh, vh, blocked, t0, t1):
    """The CPU flash kernel's layout for a dense tile, (batch, kv head) as the batch:
    q [B*Hkv, G, T, D]; k, v [B*Hkv, G, t1, D] and the mask as an additive bias
    [B*Hkv, G, T, t1] (kv heads and bias broadcast over the group, never copied)."""
    batch, n_kv_heads = kh.shape[:2]
    group = q.shape[2] // n_kv_heads
    qt = q[:, t0:t1].float().unflatten(2, (n_kv_heads, group)).permute(0, 2, 3, 1, 4)
    qt = qt.reshape(batch * n_kv_heads, group, t1 - t0, q.shape[-1])

    def keys(x):
        return x[:, :, :t1].reshape(batch * n_kv_heads, 1, t1, -1).expand(-1, group, -1, -1)

    bias = torch.zeros(blocked.shape, dtype=torch.float32, device=q.device)
    bias = bias.masked_fill_(blocked, -math.inf).view(-1, 1, t1 - t0, t1)
    return qt, keys(kh), keys(vh), bias.expand(-1, group, -1, -1)


def _fused_rows(x: torch.Tensor, batch: int) -> torch.Tensor:
    """[B*Hkv, G, T, ...] -> [B, T, Hq, ...]."""
    x = x.unflatten(0, (batch, -1)).flatten(1, 2)  # [B, Hq, T, ...]
    return x.transpose(1, 2)


def _dense_forward_tile(q, kh, vh, tiler: _Tiler, t0: int, t1: int, scale: float):
    """(o [B, T, Hq, D], lse [B, T, Hq]) of one dense tile."""
    blocked = tiler.dense_blocked(t0, t1)
    if use_fused_kernel(q.device):
        qt, kt, vt, bias = _fused_inputs(q, kh, vh, blocked, t0, t1)
        ot, lt = _CPU_FLASH(qt, kt, vt, 0.0, False, attn_mask=bias, scale=scale)
        # the kernel reports lse = 0 for a row without a visible key
        empty = blocked.all(-1).view(-1, 1, t1 - t0)
        return _fused_rows(ot, q.shape[0]), _fused_rows(lt.masked_fill(empty, -math.inf),
                                                        q.shape[0])
    qt = heads_first(q[:, t0:t1], tiler.n_kv_heads) * scale
    ot, lt = tile_forward(qt, kh[:, :, :t1], vh[:, :, :t1], tiler.group_blocked(blocked))
    return heads_last(ot, t1 - t0), heads_last(lt.unsqueeze(-1), t1 - t0).squeeze(-1)


def _dense_backward_tile(q, kh, vh, o, lse, do, tiler: _Tiler, t0: int, t1: int,
                         scale: float):
    """(dq [B, T, Hq, D], dk, dv [B, Hkv, t1, D]) of one dense tile."""
    blocked = tiler.dense_blocked(t0, t1)
    n_kv_heads, group = tiler.n_kv_heads, tiler.group
    if use_fused_kernel(q.device):
        qt, kt, vt, bias = _fused_inputs(q, kh, vh, blocked, t0, t1)

        def rows(x):  # [B, T, Hq, ...] -> [B*Hkv, G, T, ...] like qt
            x = x[:, t0:t1].float().unflatten(2, (n_kv_heads, group)).transpose(1, 3)
            return x.transpose(1, 2).reshape(-1, group, t1 - t0, *x.shape[4:])

        lt = rows(lse)
        lt = torch.where(torch.isinf(lt), 0.0, lt)  # the kernel's convention for empty rows
        dq, dk, dv = _CPU_FLASH_BACKWARD(rows(do).contiguous(), qt, kt, vt, rows(o),
                                         lt.contiguous(), 0.0, False, attn_mask=bias,
                                         scale=scale)
        shape = (tiler.batch, n_kv_heads, t1, -1)
        return _fused_rows(dq, tiler.batch), dk.sum(1).view(shape), dv.sum(1).view(shape)
    qt = heads_first(q[:, t0:t1], n_kv_heads) * scale
    ot, dot = heads_first(o[:, t0:t1], n_kv_heads), heads_first(do[:, t0:t1], n_kv_heads)
    lt = heads_first(lse[:, t0:t1].unsqueeze(-1), n_kv_heads).squeeze(-1)
    dqt, dkt, dvt = tile_backward(qt, kh[:, :, :t1], vh[:, :, :t1],
                                  tiler.group_blocked(blocked), ot, dot, lt, scale)
    return heads_last(dqt, t1 - t0), dkt, dvt


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tiler: _Tiler,
             scale: float, unshifted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    kh, vh = _to_blocks(k, tiler.block_size), _to_blocks(v, tiler.block_size)
    o = q.new_empty(q.shape)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    for t0, t1 in tiler.dense_tiles():
        o[:, t0:t1], lse[:, t0:t1] = _dense_forward_tile(q, kh, vh, tiler, t0, t1, scale)
    if tiler.sparse_start < tiler.seq:
        selected_blocks.forward_range(q, _block_rows(kh, tiler.block_size),
                               _block_rows(vh, tiler.block_size), tiler.indices,
                               tiler.sparse_start, tiler.block_size, scale, unshifted, o,
                               lse)
    return o, lse


def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, do: torch.Tensor, tiler: _Tiler, scale: float,
              unshifted: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kh, vh = _to_blocks(k, tiler.block_size), _to_blocks(v, tiler.block_size)
    dkh, dvh = torch.zeros_like(kh), torch.zeros_like(vh)
    dq = q.new_empty(q.shape)
    for t0, t1 in tiler.dense_tiles():
        dq[:, t0:t1], dkt, dvt = _dense_backward_tile(q, kh, vh, o, lse, do, tiler, t0, t1,
                                                      scale)
        dkh[:, :, :t1] += dkt
        dvh[:, :, :t1] += dvt
    if tiler.sparse_start < tiler.seq:
        bs = tiler.block_size
        selected_blocks.backward_range(q, _block_rows(kh, bs), _block_rows(vh, bs), tiler.indices,
                                o, lse, do, tiler.sparse_start, bs, scale, unshifted, dq,
                                _block_rows(dkh, bs), _block_rows(dvh, bs))
    return dq, _from_blocks(dkh, k), _from_blocks(dvh, v)


class _SelectedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                block_indices: torch.Tensor, block_size: int, scale: float, query_chunk: int,
                dense_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
        tiler = _Tiler(q, k, block_indices, block_size, query_chunk, dense_factor)
        # the sparse range's softmax form, decided once for forward and backward
        unshifted = tiler.sparse_start < tiler.seq and shift.unshifted_exp_is_safe(q, k, scale)
        o, lse = _forward(q, k, v, tiler, scale, unshifted)
        ctx.save_for_backward(q, k, v, block_indices, o, lse)
        ctx.mark_non_differentiable(lse)
        ctx.config = (block_size, scale, query_chunk, dense_factor, unshifted)
        return o, lse

    @staticmethod
    def backward(ctx, do: torch.Tensor, _dlse: torch.Tensor | None):
        q, k, v, indices, o, lse = ctx.saved_tensors
        block_size, scale, query_chunk, dense_factor, unshifted = ctx.config
        tiler = _Tiler(q, k, indices, block_size, query_chunk, dense_factor)
        dq, dk, dv = _backward(q, k, v, o, lse, do, tiler, scale, unshifted)
        return dq, dk, dv, None, None, None, None, None


def selected_attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                block_indices: torch.Tensor, block_size: int,
                                scale: float | None = None, query_chunk: int = 128, *,
                                dense_factor: float = DENSE_FACTOR,
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [B, S, Hq, D], lse [B, S, Hq] fp32, non-differentiable); see the module docstring.

    dense_factor: queries t < dense_factor * n * block_size (rounded down to whole blocks)
    take the dense masked path; 0 forces the sparse path everywhere, inf the dense one."""
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
    return _SelectedAttention.apply(q, k, v, unique_block_indices(block_indices), block_size,
                                    resolve_scale(q.shape[-1], scale), check_chunk(query_chunk),
                                    float(dense_factor))


def selected_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       block_indices: torch.Tensor, block_size: int, scale: float | None = None,
                       query_chunk: int = 128, *,
                       dense_factor: float = DENSE_FACTOR) -> torch.Tensor:
    """o [B, S, Hq, D] of selected-block attention; see the module docstring."""
    return selected_attention_with_lse(q, k, v, block_indices, block_size, scale, query_chunk,
                                       dense_factor=dense_factor)[0]
