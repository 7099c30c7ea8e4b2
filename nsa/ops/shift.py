"""When a softmax needs no row maximum.

softmax(s) = exp(s - c) / sum(exp(s - c)) for any c per row; c is usually the row maximum,
which costs a pass over the logits before the exponentials (and, over chunks of keys, an
online rescaling) and exists only to keep exp in range. Attention logits s = scale * q.k are
bounded by Cauchy-Schwarz: |s| <= scale * |q| * max_k |k|. When that bound is at most
EXP_BOUND for every query of a call, c = 0 is as good: every exp(s) lies in
[exp(-40), exp(40)] ~ [4e-18, 2e17], normal fp32 numbers (CPU exp takes a slow scalar path
on results that underflow to denormals, below exp(-87)) whose sums cannot overflow, and fp32
keeps the same relative precision whatever the common factor. `unshifted_exp_is_safe` makes
that decision once per call.
"""

from __future__ import annotations

import torch

EXP_FLOOR = -80.0
"""Shifted exponents are clamped at this: exp(-80) ~ 2e-35 is still a normal fp32 number."""
EXP_BOUND = 36.0
"""Largest |logit| for which logits are exponentiated without a shift."""


def unshifted_exp_is_safe(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    """Whether |scale * q.k| <= EXP_BOUND for every query and key of the call, by the
    Cauchy-Schwarz bound scale * |q| * max |k| (per kv head, over the heads of its group).

    q [B, S, Hq, D], k [B, N, Hkv, D], query head h reading kv head h // (Hq // Hkv). Reads
    one boolean back to the host."""
    batch, _, n_q_heads, _ = q.shape
    n_kv_heads = k.shape[2]
    if k.shape[1] == 0 or q.shape[1] == 0:
        return True
    key_max = torch.linalg.vector_norm(k.float(), dim=-1).amax(dim=1)  # [B, Hkv]
    query_max = torch.linalg.vector_norm(q.float(), dim=-1).amax(dim=1)  # [B, Hq]
    query_max = query_max.view(batch, n_kv_heads, n_q_heads // n_kv_heads).amax(-1)
    return bool((query_max * key_max).max() * scale <= EXP_BOUND)
