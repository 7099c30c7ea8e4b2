"""Defect: gradient checkpointing through a late-bound closure.

    for blk in self.blocks:
        x = checkpoint(lambda t: blk(t), x, use_reentrant=reentrant)

The lambda looks `blk` up when it is called, not when it is made. The forward calls it at
once, inside the loop, so the forward is right. The backward recomputes each checkpointed
segment after the loop has ended, when `blk` names the LAST block: every layer's recompute
runs the last block's parameters.

Expected verdicts:
  * WRONG from `nsadiag check ckpt` (a plain trial finishes and looks healthy). With
    use_reentrant=False the recompute only rebuilds the saved activations: the shapes
    match, so nothing raises, but every block except the last gets gradients computed from
    the last block's activations — silently wrong. The recompute differential names
    blocks.0, whose recompute ran blocks.{n-1}'s parameters.
  * ERROR under DDP with reentrant=True: the reentrant recompute builds a fresh graph with
    the last block's parameters and back-propagates through it once per layer, so DDP sees
    those parameters become ready n_layers times ("Expected to mark a variable ready only
    once") while the other blocks' parameters never get a gradient.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from repro._base import ResidualMLP, TinyLM


class LateBoundCheckpointLM(TinyLM):
    """TinyLM whose blocks are checkpointed through a closure over the loop variable."""

    def __init__(self, n_layers: int, dim: int, reentrant: bool, grad_ckpt: bool):
        super().__init__([ResidualMLP(dim) for _ in range(n_layers)], dim=dim)
        self.reentrant, self.grad_ckpt = reentrant, grad_ckpt

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids % self.embed.num_embeddings)
        for blk in self.blocks:
            if self.grad_ckpt and torch.is_grad_enabled():
                x = checkpoint(lambda t: blk(t), x, use_reentrant=self.reentrant)  # noqa: B023 - the defect
            else:
                x = blk(x)
        return self.head(x)


def make(n_layers: int = 4, dim: int = 32, reentrant: bool = False,
         grad_ckpt: bool = True) -> nn.Module:
    return LateBoundCheckpointLM(n_layers, dim, reentrant, grad_ckpt)
