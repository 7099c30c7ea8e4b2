"""Shared tile kernels of the memory-bounded torch backend.

A *tile* is a batch of independent attention problems laid out as
q [..., M, D] (already multiplied by the softmax scale), k, v [..., K, D] and a boolean
`blocked` mask broadcastable to [..., M, K] (True = the query may NOT attend the key).
All tile math is fp32. Empty rows (every key blocked) give o = 0, lse = -inf and zero
gradients, never NaN.

`DenseBandAttention` is the flash-style autograd Function shared by the sliding-window and
compressed branches: every query tile reads one contiguous key range [k0, k1) shared by all
its queries, so the key tile is a slice, never a gather. On the CPU each tile goes through
aten's fused flash kernel (the one SDPA uses there, with the band as an additive mask):
about twice as fast as the unfused tile math, which still serves other devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

NEG_INF = float("-inf")
_FP32_MIN = torch.finfo(torch.float32).min
# aten's fused flash-attention kernel for CPU (what SDPA runs there), called per tile so
# that our own autograd Function keeps the saved state to q, k, v, o and lse
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_CPU_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
_EXP_FLOOR = -80.0

# band(t0, t1, device) -> (k0, k1, blocked [t1 - t0, k1 - k0] bool), True = hidden
Band = Callable[[int, int, torch.device], tuple[int, int, torch.Tensor]]


def resolve_scale(head_dim: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def check_chunk(query_chunk: int) -> int:
    if not isinstance(query_chunk, int) or isinstance(query_chunk, bool) or query_chunk < 1:
        raise ValueError(f"query_chunk: must be a positive integer, got {query_chunk!r}")
    return query_chunk


def check_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Validate q [B,S,Hq,D], k/v [B,N,Hkv,D]; return the GQA group size G = Hq // Hkv."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"q/k/v: expected q [B,S,Hq,D] and k = v [B,N,Hkv,D], got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
        raise ValueError(f"q/k: batch and head_dim must match and Hq must be a multiple of "
                         f"Hkv, got {tuple(q.shape)} and {tuple(k.shape)}")
    return q.shape[2] // k.shape[2]


def _masked_exp(x: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """exp(x) in place with blocked entries exactly 0.

    The floor matters for speed, not accuracy: CPU exp takes a scalar slow path (up to ~20x
    slower) on -inf and on results that underflow to denormals. exp(-80) ~ 2e-35 stays a
    normal float, and blocked entries are zeroed afterwards."""
    return x.clamp_min_(_EXP_FLOOR).exp_().masked_fill_(blocked, 0.0)


def tile_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 blocked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(o [..., M, D], lse [..., M]) of one tile; q is pre-scaled."""
    logits = torch.matmul(q, k.transpose(-1, -2)).masked_fill_(blocked, NEG_INF)
    row_max = logits.amax(dim=-1, keepdim=True)  # -inf on empty rows
    # clamping keeps -inf - (-inf) = NaN out of empty rows; their entries are all blocked
    probs = _masked_exp(logits.sub_(row_max.clamp_min(_FP32_MIN)), blocked)
    total = probs.sum(dim=-1, keepdim=True)  # >= 1 unless the row is empty (then 0)
    lse = (row_max + total.log()).squeeze(-1)  # -inf + log 0 = -inf on empty rows
    return torch.matmul(probs.div_(total.clamp_min_(1.0)), v), lse


def _recompute_probs(q: torch.Tensor, k: torch.Tensor, blocked: torch.Tensor,
                     lse: torch.Tensor) -> torch.Tensor:
    logits = torch.matmul(q, k.transpose(-1, -2))
    # empty rows (lse = -inf) shift by +inf instead: their logits go to -inf, all blocked -> 0
    shift = torch.where(torch.isneginf(lse), math.inf, lse)
    return _masked_exp(logits.sub_(shift.unsqueeze(-1)), blocked)


def tile_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocked: torch.Tensor,
                  o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor, scale: float,
                  dkv_out: tuple[torch.Tensor, torch.Tensor] | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one tile from recomputed probabilities; q is pre-scaled.

    `dkv_out` are optional preallocated buffers shaped like k and v for dk and dv.
    """
    dk_out, dv_out = (None, None) if dkv_out is None else dkv_out
    probs = _recompute_probs(q, k, blocked, lse)
    dv = torch.matmul(probs.transpose(-1, -2), do, out=dv_out)
    delta = (do * o).sum(-1, keepdim=True)
    ds = torch.matmul(do, v.transpose(-1, -2)).sub_(delta).mul_(probs)
    dq = torch.matmul(ds, k).mul_(scale)
    dk = torch.matmul(ds.transpose(-1, -2), q, out=dk_out)  # q carries the scale already
    return dq, dk, dv


def heads_first(x: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """[B, T, Hq, D] -> fp32 [B, Hkv, T*G, D]: the G heads of a kv group share its keys."""
    batch, seq, n_q_heads, head_dim = x.shape
    group = n_q_heads // n_kv_heads
    x = x.float().reshape(batch, seq, n_kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    return x.reshape(batch, n_kv_heads, seq * group, head_dim)


def heads_last(x: torch.Tensor, seq: int) -> torch.Tensor:
    """Inverse of `heads_first` for [B, Hkv, T*G, ...] -> [B, T, Hq, ...]."""
    batch, n_kv_heads, rows = x.shape[:3]
    group = rows // seq
    tail = x.shape[3:]
    x = x.view(batch, n_kv_heads, seq, group, *tail).transpose(1, 2)
    return x.reshape(batch, seq, n_kv_heads * group, *tail)


def _expand_groups(blocked: torch.Tensor, group: int) -> torch.Tensor:
    """[T, K] -> [T*G, K], matching the row order of `heads_first`."""
    n_rows, n_keys = blocked.shape
    return blocked.unsqueeze(1).expand(n_rows, group, n_keys).reshape(n_rows * group, n_keys)


def _cpu_kernel_inputs(q, kh, vh, blocked, t0, t1, k0, k1):
    """Layouts of the fused CPU flash kernel, one problem per (batch, kv head): the G query
    heads of a group as rows, q [B, Hkv, T*G, D] (`heads_first`); k, v [B, Hkv, K, D]
    (slices, never repeated per query head); the mask as an additive fp32 bias [T*G, K]
    (the kernel's requirement), shared by every problem."""
    group = q.shape[2] // kh.shape[1]
    qt = heads_first(q[:, t0:t1], kh.shape[1])
    blocked = _expand_groups(blocked, group)
    bias = torch.zeros(blocked.shape, dtype=torch.float32, device=q.device)
    return qt, kh[:, :, k0:k1], vh[:, :, k0:k1], bias.masked_fill_(blocked, NEG_INF)


def fused_cpu_forward(q, kh, vh, blocked, t0, t1, k0, k1, scale):
    """One tile through aten's CPU flash kernel -> (o [B, T, Hq, D], lse [B, T, Hq]).

    The kernel reports lse = 0 for a row with no visible key; it becomes -inf here."""
    qt, kt, vt, bias = _cpu_kernel_inputs(q, kh, vh, blocked, t0, t1, k0, k1)
    ot, lt = _CPU_FLASH(qt, kt, vt, 0.0, False, attn_mask=bias, scale=scale)
    empty = blocked.all(-1).repeat_interleave(q.shape[2] // kh.shape[1])  # rows of qt
    lt = lt.masked_fill(empty, NEG_INF)
    return heads_last(ot, t1 - t0), heads_last(lt.unsqueeze(-1), t1 - t0).squeeze(-1)


def fused_cpu_backward(q, kh, vh, blocked, t0, t1, k0, k1, o, lse, do, scale):
    """Gradients of one tile from aten's CPU flash backward: dq [B, T, Hq, D] and
    dk, dv [B, Hkv, k1 - k0, D]."""
    qt, kt, vt, bias = _cpu_kernel_inputs(q, kh, vh, blocked, t0, t1, k0, k1)
    n_kv_heads = kh.shape[1]
    ot, dot = heads_first(o[:, t0:t1], n_kv_heads), heads_first(do[:, t0:t1], n_kv_heads)
    lt = heads_first(lse[:, t0:t1].unsqueeze(-1), n_kv_heads).squeeze(-1)
    lt = torch.where(torch.isinf(lt), 0.0, lt)  # the kernel's convention for empty rows
    dq, dk, dv = _CPU_FLASH_BACKWARD(dot, qt, kt, vt, ot, lt, 0.0, False, attn_mask=bias,
                                     scale=scale)
    return heads_last(dq, t1 - t0), dk, dv


def dense_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, band: Band, scale: float,
                  query_chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seq, n_q_heads, head_dim = q.shape
    n_kv_heads = k.shape[2]
    group = n_q_heads // n_kv_heads
    kh, vh = (x.float().transpose(1, 2).contiguous() for x in (k, v))  # [B, Hkv, N, D]
    o = q.new_zeros(q.shape)
    lse = torch.full((batch, seq, n_q_heads), NEG_INF, dtype=torch.float32, device=q.device)
    for t0 in range(0, seq, query_chunk):
        t1 = min(seq, t0 + query_chunk)
        k0, k1, blocked = band(t0, t1, q.device)
        if k1 <= k0:
            continue  # no visible key for the whole tile: o = 0, lse = -inf
        if q.device.type == "cpu":
            ot, lt = fused_cpu_forward(q, kh, vh, blocked, t0, t1, k0, k1, scale)
            o[:, t0:t1], lse[:, t0:t1] = ot, lt
            continue
        qt = heads_first(q[:, t0:t1], n_kv_heads) * scale  # not in place: may view q
        ot, lt = tile_forward(qt, kh[:, :, k0:k1], vh[:, :, k0:k1],
                              _expand_groups(blocked, group))
        o[:, t0:t1] = heads_last(ot, t1 - t0)
        lse[:, t0:t1] = heads_last(lt.unsqueeze(-1), t1 - t0).squeeze(-1)
    return o, lse


def dense_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, do: torch.Tensor, band: Band, scale: float,
                   query_chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seq, n_kv_heads = q.shape[1], k.shape[2]
    group = q.shape[2] // n_kv_heads
    kh, vh = (x.float().transpose(1, 2).contiguous() for x in (k, v))
    dq = q.new_zeros(q.shape)  # tiles that see no key are skipped
    dkh, dvh = torch.zeros_like(kh), torch.zeros_like(vh)
    for t0 in range(0, seq, query_chunk):
        t1 = min(seq, t0 + query_chunk)
        k0, k1, blocked = band(t0, t1, q.device)
        if k1 <= k0:
            continue
        if q.device.type == "cpu":
            dqt, dkt, dvt = fused_cpu_backward(q, kh, vh, blocked, t0, t1, k0, k1, o, lse, do,
                                               scale)
            dq[:, t0:t1] = dqt
        else:
            qt = heads_first(q[:, t0:t1], n_kv_heads) * scale  # not in place: may view q
            ot = heads_first(o[:, t0:t1], n_kv_heads)
            dot = heads_first(do[:, t0:t1], n_kv_heads)
            lt = heads_first(lse[:, t0:t1].unsqueeze(-1), n_kv_heads).squeeze(-1)
            dqt, dkt, dvt = tile_backward(qt, kh[:, :, k0:k1], vh[:, :, k0:k1],
                                          _expand_groups(blocked, group), ot, dot, lt, scale)
            dq[:, t0:t1] = heads_last(dqt, t1 - t0)
        dkh[:, :, k0:k1] += dkt
        dvh[:, :, k0:k1] += dvt
    return dq, _kv_layout(dkh, k.dtype), _kv_layout(dvh, v.dtype)


def _kv_layout(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, Hkv, N, D] fp32 -> contiguous [B, N, Hkv, D] in `dtype`."""
    return x.transpose(1, 2).to(dtype).contiguous()


class DenseBandAttention(torch.autograd.Function):
    """(o, lse) of attention where each query tile reads one contiguous key range.

    Saves only q, k, v, o and lse; probabilities are recomputed tile by tile in backward.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, band: Band,
                scale: float, query_chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        o, lse = dense_forward(q, k, v, band, scale, query_chunk)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mark_non_differentiable(lse)
        ctx.band, ctx.scale, ctx.query_chunk = band, scale, query_chunk
        return o, lse

    @staticmethod
    def backward(ctx, do: torch.Tensor, _dlse: torch.Tensor | None):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = dense_backward(q, k, v, o, lse, do, ctx.band, ctx.scale, ctx.query_chunk)
        return dq, dk, dv, None, None, None


def _blocked(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """[M, K] True above the diagonal (query i sees keys 0..i), or nothing blocked."""
    if not causal:
        return torch.zeros(1, 1, dtype=torch.bool, device=q.device)
    return torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu_(1)


def attend_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                   causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked (or causal) attention of independent problems, fp32.

    q [N, H, M, D], k, v [N, H, K, D] -> (o [N, H, M, D], lse [N, H, M]). On the CPU this is
    aten's fused flash kernel; elsewhere the tile math above."""
    if q.device.type == "cpu":
        return _CPU_FLASH(q, k, v, 0.0, causal, scale=scale)
    return tile_forward(q * scale, k, v, _blocked(q, k, causal))


def attend_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    o: torch.Tensor, lse: torch.Tensor, scale: float,
                    causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of `attend_forward` given the softmax statistics (o, lse) to use.

    o and lse may be those of a larger softmax that this problem is one part of: the
    gradients are then this part's share (the split-KV identity)."""
    if q.device.type == "cpu":
        return _CPU_FLASH_BACKWARD(do, q, k, v, o, lse, 0.0, causal, scale=scale)
    return tile_backward(q * scale, k, v, _blocked(q, k, causal), o, do, lse, scale)
