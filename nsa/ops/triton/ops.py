"""The Triton kernels' entry points (importing this module builds the kernels).

The kernels run on CUDA tensors, or on CPU tensors when Triton was imported in interpreter
mode (TRITON_INTERPRET=1 set by the caller before the first import; nothing here reads the
environment). `device_unsupported_reason` says which applies.
"""

from __future__ import annotations

import torch

from nsa.config import num_select_blocks
from nsa.ops.selection import top_n_from_keys
from nsa.ops.triton.band import _band_fwd, compressed_attention, window_attention_with_lse
from nsa.ops.triton.scores import block_scores
from nsa.ops.triton.selected import selected_attention, selected_attention_with_lse

__all__ = [
    "INTERPRETED",
    "block_scores",
    "compressed_attention",
    "device_unsupported_reason",
    "select_blocks",
    "selected_attention",
    "selected_attention_with_lse",
    "window_attention_with_lse",
]

INTERPRETED = type(_band_fwd).__name__ == "InterpretedFunction"
"""True when the kernels were built for Triton's CPU interpreter."""


def device_unsupported_reason(device: torch.device) -> str | None:
    """Why the kernels cannot run on `device`, or None when they can."""
    if INTERPRETED:
        return None if device.type == "cpu" else (
            f"the triton kernels were built for the CPU interpreter; tensors are on {device}")
    if device.type != "cuda":
        return (f"the triton backend needs a CUDA device, got {device.type} "
                "(use backend torch or auto)")
    return None


SCORE_ELEMENTS = 1 << 24
"""Score elements (queries x batch x kv heads x blocks) ranked at a time by `select_blocks`."""


def select_blocks(q: torch.Tensor, k_cmp: torch.Tensor, lse: torch.Tensor | None,
                  cfg, scale: float) -> torch.Tensor:
    """Block indices [B, S, Hkv, n_sel] (int64, ascending, -1 padding) as
    `nsa.ops.selection.select_blocks` defines them, with the scores from the Triton kernel.

    lse: the compressed branch's log-sum-exp [B, S, Hq] (fp32), or None to compute it.
    Queries are ranked in chunks so that at most SCORE_ELEMENTS scores exist at a time."""
    batch, seq = q.shape[:2]
    n_kv_heads = k_cmp.shape[2]
    n_blocks = num_select_blocks(seq, cfg)
    chunk = max(1, SCORE_ELEMENTS // max(1, batch * n_kv_heads * n_blocks))
    out = torch.empty(batch, seq, n_kv_heads, cfg.n_sel, dtype=torch.long, device=q.device)
    with torch.no_grad():
        k_cmp = k_cmp.to(q.dtype)
        for start in range(0, seq, chunk):
            stop = min(start + chunk, seq)
            keys = block_scores(q, k_cmp, lse, start, stop - start, n_blocks, cfg.l, cfg.d,
                                cfg.l_sel, scale, rank_keys=True)
            out[:, start:stop] = top_n_from_keys(keys, cfg)
    return out
