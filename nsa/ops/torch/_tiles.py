"""Shared tile kernels of the memory-bounded torch backend.

A *tile* is a batch of independent attention problems laid out as
q [..., M, D] (already multiplied by the softmax scale), k, v [..., K, D] and a boolean
`blocked` mask broadcastable to [..., M, K] (True = the query may NOT attend the key).
All tile math is fp32. Empty rows (every key blocked) give o = 0, lse = -inf and zero
gradients, never NaN.

`DenseBandAttention` is the flash-style autograd Function shared by the sliding-window and
compressed branches: every query tile reads one contiguous key range [k0, k1) shared by all
its queries, so the key tile is a slice, never a gather. The band also names the keys
[k0, k_open) that every query of the tile sees: on the CPU that part goes through aten's
fused flash kernel (the one SDPA uses there) without a mask, the rest [k_open, k1) with the
band as an additive mask, and the two are merged by their log-sum-exp (backward hands both
the merged o and lse: each part's gradients are then exactly its share). The fused kernel
is about twice as fast as the unfused tile math, which still serves other devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from nsa.ops.shift import EXP_FLOOR

NEG_INF = float("-inf")
_FP32_MIN = torch.finfo(torch.float32).min
# aten's fused flash-attention kernel for CPU (what SDPA runs there), called per tile so
# that our own autograd Function keeps the saved state to q, k, v, o and lse
_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_CPU_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def use_fused_kernel(device: torch.device) -> bool:
    """Whether tiles on `device` go through aten's fused CPU flash kernel (the CPU) or the
    unfused tile math (every other device)."""
    return device.type == "cpu"

# band(t0, t1, device) -> (k0, k_open, k1, blocked [t1 - t0, k1 - k_open] bool): keys
# [k0, k_open) are visible to every query of the tile, blocked (True = hidden) masks the rest
Band = Callable[[int, int, torch.device], tuple[int, int, int, torch.Tensor]]


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
    return x.clamp_min_(EXP_FLOOR).exp_().masked_fill_(blocked, 0.0)


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


def _cpu_bias(blocked: torch.Tensor, group: int) -> torch.Tensor:
    """[T, K] bool -> the fused kernel's additive fp32 mask [T*G, K] (rows of `heads_first`)."""
    blocked = _expand_groups(blocked, group)
    bias = torch.zeros(blocked.shape, dtype=torch.float32, device=blocked.device)
    return bias.masked_fill_(blocked, NEG_INF)


def _merge_parts(o_a, lse_a, o_b, lse_b):
    """Log-sum-exp merge of two parts of one softmax over disjoint keys; part a sees a key
    on every row. o [..., M, D], lse [..., M] -> (o, lse)."""
    lse = torch.logaddexp(lse_a, lse_b)
    o = o_a.mul_(torch.exp(lse_a - lse).unsqueeze(-1))
    return o.add_(o_b.mul_(torch.exp(lse_b - lse).unsqueeze(-1))), lse


def fused_cpu_forward(q, kh, vh, band_keys, t0, t1, scale):
    """One tile through aten's CPU flash kernel -> (o [B, T, Hq, D], lse [B, T, Hq]).

    band_keys = (k0, k_open, k1, blocked) of the band. The G query heads of a kv group are
    the rows of one problem per (batch, kv head), so keys are slices, never repeated per
    head. The kernel reports lse = 0 for a row with no visible key; it becomes -inf here."""
    k0, k_open, k1, blocked = band_keys
    n_kv_heads = kh.shape[1]
    group = q.shape[2] // n_kv_heads
    qt = heads_first(q[:, t0:t1], n_kv_heads)
    parts = []
    if k_open > k0:
        parts.append(_CPU_FLASH(qt, kh[:, :, k0:k_open], vh[:, :, k0:k_open], 0.0, False,
                                scale=scale))
    if k1 > k_open:
        ot, lt = _CPU_FLASH(qt, kh[:, :, k_open:k1], vh[:, :, k_open:k1], 0.0, False,
                            attn_mask=_cpu_bias(blocked, group), scale=scale)
        parts.append((ot, lt.masked_fill(blocked.all(-1).repeat_interleave(group), NEG_INF)))
    ot, lt = parts[0] if len(parts) == 1 else _merge_parts(*parts[0], *parts[1])
    return heads_last(ot, t1 - t0), heads_last(lt.unsqueeze(-1), t1 - t0).squeeze(-1)


def fused_cpu_backward(q, kh, vh, band_keys, t0, t1, o, lse, do, scale):
    """Gradients of one tile from aten's CPU flash backward, part by part (the same split
    as `fused_cpu_forward`, each part given the merged o and lse): dq [B, T, Hq, D] and
    dk, dv [B, Hkv, k1 - k0, D]."""
    k0, k_open, k1, blocked = band_keys
    n_kv_heads = kh.shape[1]
    group = q.shape[2] // n_kv_heads
    qt = heads_first(q[:, t0:t1], n_kv_heads)
    ot, dot = heads_first(o[:, t0:t1], n_kv_heads), heads_first(do[:, t0:t1], n_kv_heads)
    lt = heads_first(lse[:, t0:t1].unsqueeze(-1), n_kv_heads).squeeze(-1)
    lt = torch.where(torch.isinf(lt), 0.0, lt)  # the kernel's convention for empty rows
    dq, dks, dvs = None, [], []
    for lo, hi, bias in ((k0, k_open, None), (k_open, k1, blocked)):
        if hi <= lo:
            continue
        mask = None if bias is None else _cpu_bias(bias, group)
        dq_part, dk, dv = _CPU_FLASH_BACKWARD(dot, qt, kh[:, :, lo:hi], vh[:, :, lo:hi], ot, lt,
                                              0.0, False, attn_mask=mask, scale=scale)
        dq = dq_part if dq is None else dq.add_(dq_part)
        dks.append(dk)
        dvs.append(dv)
    return heads_last(dq, t1 - t0), torch.cat(dks, 2), torch.cat(dvs, 2)


def _full_mask(band_keys, device) -> torch.Tensor:
    """The band's mask over all of [k0, k1) (the unfused tile math takes one mask)."""
    k0, k_open, _, blocked = band_keys
    open_part = torch.zeros(blocked.shape[0], k_open - k0, dtype=torch.bool, device=device)
    return torch.cat([open_part, blocked], dim=1)


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
        band_keys = band(t0, t1, q.device)
        k0, _, k1, _ = band_keys
        if k1 <= k0:
            continue  # no visible key for the whole tile: o = 0, lse = -inf
        if use_fused_kernel(q.device):
            o[:, t0:t1], lse[:, t0:t1] = fused_cpu_forward(q, kh, vh, band_keys, t0, t1, scale)
            continue
        qt = heads_first(q[:, t0:t1], n_kv_heads) * scale  # not in place: may view q
        ot, lt = tile_forward(qt, kh[:, :, k0:k1], vh[:, :, k0:k1],
                              _expand_groups(_full_mask(band_keys, q.device), group))
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
        band_keys = band(t0, t1, q.device)
        k0, _, k1, _ = band_keys
        if k1 <= k0:
            continue
        if use_fused_kernel(q.device):
            dqt, dkt, dvt = fused_cpu_backward(q, kh, vh, band_keys, t0, t1, o, lse, do, scale)
            dq[:, t0:t1] = dqt
        else:
            qt = heads_first(q[:, t0:t1], n_kv_heads) * scale  # not in place: may view q
            ot = heads_first(o[:, t0:t1], n_kv_heads)
            dot = heads_first(do[:, t0:t1], n_kv_heads)
            lt = heads_first(lse[:, t0:t1].unsqueeze(-1), n_kv_heads).squeeze(-1)
            blocked = _expand_groups(_full_mask(band_keys, q.device), group)
            dqt, dkt, dvt = tile_backward(qt, kh[:, :, k0:k1], vh[:, :, k0:k1], blocked, ot,
                                          dot, lt, scale)
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
