"""Block-index rules shared by every selected-attention backend (torch and Triton).

A row of block_indices lists the blocks one query attends. A block listed more than once
is attended once: the keys of a block are a set, and counting them twice would weigh that
block double in the softmax. `unique_block_indices` enforces this before any backend
reads the indices, so every path (dense, block by block, kernels) sees rows without repeats.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["unique_block_indices"]


def unique_block_indices(block_indices: torch.Tensor) -> torch.Tensor:
    """[..., n] integer -> int64 [..., n]: each repeated entry of a row after its first
    occurrence replaced by -1 (padding); first occurrences keep their position.

    Negative entries are padding already and stay as they are. Rows without repeats
    (top-n selection never repeats a block) come back unchanged."""
    indices = block_indices.long()
    if indices.shape[-1] < 2:
        return indices
    # a stable sort puts the first occurrence of a value ahead of its repeats
    values, order = indices.sort(dim=-1, stable=True)
    repeat = F.pad(values[..., 1:] == values[..., :-1], (1, 0), value=False)
    repeat = torch.zeros_like(repeat).scatter_(-1, order, repeat)
    return indices.masked_fill(repeat, -1)
