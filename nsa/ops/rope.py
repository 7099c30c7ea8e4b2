"""Rotary position embedding (RoPE), rotating channel pairs (i, i + D/2).

x [B, S, H, D] at positions 0..S-1, with a = x[..., :D/2], b = x[..., D/2:] and angles
theta^(-2i/D) * t:
    rope(x) = cat(a * cos - b * sin, a * sin + b * cos)
The rotation is orthogonal, so the gradient is the inverse rotation of the output gradient:
    dx = cat(da * cos + db * sin, -da * sin + db * cos)
`apply_rope` computes both directions into one new tensor each (no per-term temporaries:
on the CPU every fresh multi-MiB temporary costs page faults as well as a pass over memory).
"""

from __future__ import annotations

import torch


def rope_tables(seq_len: int, head_dim: int, theta: float, device, dtype):
    """cos, sin [S, 1, D/2] for rotating channel pairs (i, i + D/2) at positions 0..S-1."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                         / head_dim)
    angles = torch.arange(seq_len, device=device, dtype=torch.float32).unsqueeze(1) * inv_freq
    return angles.cos().unsqueeze(1).to(dtype), angles.sin().unsqueeze(1).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """cat(a * cos - b * sin, a * sin + b * cos) into one new contiguous tensor; the inverse
    rotation is the same call with -sin."""
    out = torch.empty(x.shape, dtype=torch.result_type(x, cos), device=x.device)
    first, second = x.chunk(2, dim=-1)
    out_first, out_second = out.chunk(2, dim=-1)
    torch.mul(first, cos, out=out_first).addcmul_(second, sin, value=-1)
    torch.mul(first, sin, out=out_second).addcmul_(second, cos)
    return out


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        ctx.x_dtype = x.dtype
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, -sin).to(ctx.x_dtype), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] rotated by position; cos/sin [S, 1, D/2] from rope_tables (constants:
    no gradient flows to them)."""
    if x.shape[-1] % 2:
        raise ValueError(f"rope: head_dim must be even, got {x.shape[-1]}")
    return _Rope.apply(x, cos.detach(), sin.detach())
