"""Memory-bounded (flash-style, query-tiled) pure-PyTorch NSA attention ops.

All three ops take q [B, S, Hq, D] and kv-head-major keys [B, *, Hkv, D] (GQA, G = Hq // Hkv),
compute in fp32, save only inputs, output and log-sum-exp for backward, and return results
in the input dtype.
"""

from nsa.ops.torch.compressed import compressed_attention, compressed_attention_and_selection
from nsa.ops.torch.selected import selected_attention, selected_attention_with_lse
from nsa.ops.torch.window import window_attention, window_attention_with_lse

__all__ = [
    "compressed_attention",
    "compressed_attention_and_selection",
    "selected_attention",
    "selected_attention_with_lse",
    "window_attention",
    "window_attention_with_lse",
]
