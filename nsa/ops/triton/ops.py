"""The Triton kernels' entry points (importing this module builds the kernels).

The kernels run on CUDA tensors, or on CPU tensors when Triton was imported in interpreter
mode (TRITON_INTERPRET=1 set by the caller before the first import; nothing here reads the
environment). `device_unsupported_reason` says which applies.
"""

from __future__ import annotations

import torch

from nsa.ops.triton.band import _band_fwd, compressed_attention, window_attention_with_lse
from nsa.ops.triton.mix import gated_sum
from nsa.ops.triton.select import (
    block_scores,
    compressed_attention_and_selection,
    select_blocks,
)
from nsa.ops.triton.selected import selected_attention, selected_attention_with_lse

__all__ = [
    "INTERPRETED",
    "block_scores",
    "compressed_attention",
    "compressed_attention_and_selection",
    "device_unsupported_reason",
    "gated_sum",
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
