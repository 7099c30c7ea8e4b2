"""The gated sum of the branch outputs (NSA Eq.5): o = sum_c g_c * o_c.

o_c [B, S, H, D] per branch, g_c [B, S, H] (one gate per head and query). Backward:
    d o_c = g_c * d o        d g_c = <o_c, d o> over D
Written as one autograd Function so that forward fills one output (no per-branch product
and partial sum) and backward forms each <o_c, d o> as a batched dot product without a
[B, S, H, D] temporary: on the CPU every fresh multi-MiB tensor costs page faults as well as
a pass over memory.
"""

from __future__ import annotations

import torch


def _dot_last(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """<x, y> over the last dimension: [..., D] x [..., D] -> [...]."""
    width = x.shape[-1]
    return torch.bmm(x.reshape(-1, 1, width), y.reshape(-1, width, 1)).view(x.shape[:-1])


class _GatedSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *pairs: torch.Tensor) -> torch.Tensor:
        outputs, gates = pairs[0::2], pairs[1::2]
        out = torch.mul(outputs[0], gates[0].unsqueeze(-1))
        for o, g in zip(outputs[1:], gates[1:], strict=True):
            out.addcmul_(o, g.unsqueeze(-1))
        ctx.save_for_backward(*pairs)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        pairs = ctx.saved_tensors
        grads = []
        for o, g in zip(pairs[0::2], pairs[1::2], strict=True):
            grads.append((grad * g.unsqueeze(-1)).to(o.dtype) if ctx.needs_input_grad[len(grads)]
                         else None)
            grads.append(_dot_last(o.to(grad.dtype), grad).to(g.dtype)
                         if ctx.needs_input_grad[len(grads)] else None)
        return tuple(grads)


def gated_sum(outputs: list[torch.Tensor], gates: list[torch.Tensor]) -> torch.Tensor:
    """sum_c gates[c][..., None] * outputs[c]: outputs [B, S, H, D], gates [B, S, H]."""
    if not outputs or len(outputs) != len(gates):
        raise ValueError(f"gated_sum: need one gate per output, got {len(outputs)} outputs "
                         f"and {len(gates)} gates")
    for o, g in zip(outputs, gates, strict=True):
        if o.shape != outputs[0].shape or g.shape != o.shape[:-1]:
            raise ValueError(f"gated_sum: outputs must share one shape [B, S, H, D] and gates "
                             f"be [B, S, H]; got {tuple(o.shape)} and {tuple(g.shape)}")
    pairs = [t for pair in zip(outputs, gates, strict=True) for t in pair]
    return _GatedSum.apply(*pairs)
