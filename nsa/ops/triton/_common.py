"""Shape limits and tile sizes shared by the Triton NSA kernels.

The kernels take `tl.dot` tiles whose sides are powers of two of at least 16, so the head
dimension and the selection block size must be such powers; the G query heads of a KV group
become the rows of one tile, padded with masked rows up to a power of two of at least 16.
"""

from __future__ import annotations

import torch

# Larger head dims or blocks would need smaller tiles to fit the tiles of a dK/dV program
# (q, do, k, v and two fp32 accumulators) in shared memory and registers.
HEAD_DIMS = (16, 32, 64, 128)
MIN_BLOCK = 16
MAX_BLOCK = 128
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def pow2_at_least(n: int, floor: int) -> int:
    """The smallest power of two >= max(n, floor)."""
    size = 1
    while size < max(n, floor):
        size *= 2
    return size


def group_tile_rows(group: int) -> int:
    """Rows of a group-centric tile: the group's query heads padded for `tl.dot`."""
    return pow2_at_least(group, 16)


def unsupported_reason(head_dim: int, block_size: int | None = None) -> str | None:
    """Why the Triton kernels cannot run this shape, or None when they can."""
    if head_dim not in HEAD_DIMS:
        return (f"head_dim {head_dim} is not supported by the triton backend "
                f"(one of {', '.join(map(str, HEAD_DIMS))})")
    if block_size is not None and (block_size < MIN_BLOCK or block_size > MAX_BLOCK
                                   or block_size & (block_size - 1)):
        return (f"l_sel {block_size} is not supported by the triton backend "
                f"(a power of two from {MIN_BLOCK} to {MAX_BLOCK})")
    return None


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 block_size: int | None = None) -> None:
    """Raise ValueError (one line naming the limit) for inputs the kernels cannot take."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(f"q, k, v: expected [B, S, H, D] with k and v alike, got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3] or q.shape[2] % k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: batch and head_dim must "
                         "match and the query heads must be a multiple of the kv heads")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v: one dtype of float32/float16/bfloat16 expected, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    reason = unsupported_reason(q.shape[3], block_size)
    if reason:
        raise ValueError(reason)


def dot_precision(x: torch.Tensor) -> str:
    """fp32 inputs multiply in full fp32 (tf32 would miss the 1e-5 oracle parity)."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


def launch_options(dtype: torch.dtype, tile_elements: int) -> dict[str, int]:
    """num_warps / num_stages for a program whose largest tile has `tile_elements` elements:
    fp32 tiles are twice the bytes, so they get one pipeline stage; large tiles get more
    warps so that their fp32 accumulators fit in registers."""
    return {"num_warps": 8 if tile_elements >= 128 * 128 else 4,
            "num_stages": 1 if dtype == torch.float32 else 2}
