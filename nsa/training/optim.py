"""AdamW with decoupled weight decay on matrices, and the warm-up + cosine schedule."""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from nsa.training.options import TrainArgs


def build_optimizer(model: nn.Module, args: TrainArgs) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (>= 2-D) only, none on gains and biases."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for 0-based optimizer step `step` of `total`.

    Linear warm-up over `warmup` steps to 1, then cosine down to `min_ratio` at the last step.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - 1 - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, args: TrainArgs):
    factor = functools.partial(lr_factor, warmup=args.warmup, total=args.steps,
                               min_ratio=args.min_lr / args.lr)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
