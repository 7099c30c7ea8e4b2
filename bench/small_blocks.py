"""The small residual block of the overhead benches (bench/gil_loop.py,
bench/bench_block_hooks.py): Linear, LayerNorm and GELU on a residual, about 0.1 ms a
call: a model of many of them makes many tiny module calls a step."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.l, self.n, self.a = nn.Linear(width, width), nn.LayerNorm(width), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.a(self.n(self.l(x)))
