"""Defect: rank-divergent control flow under DDP. One rank takes a data-dependent branch
that issues a collective the other ranks never issue.

The model keeps a statistic check in its second block: when the check fires on a rank's
batch, that rank sums a counter over a separate metrics process group (a gloo group, as
training code often keeps statistics off the gradient group). Only the ranks whose batch
trips the check issue that all_reduce, so it never completes: the tripped rank waits in it
inside blocks.1's forward, while the others finish forward and backward and wait in DDP's
gradient all_reduce, which the tripped rank never reaches. The check stands for a
data-dependent condition that holds on one shard only (an overflow count, a NaN guard, a
long-document branch); here it is pinned to `trip_rank` at `trip_step` so the entry
reproduces the same way every time. Without a process group (one process) it never fires.

Expected verdict under `nsadiag ddp --world-size 2` (gloo on a CPU): STALL-COLLECTIVE
naming rank 1: it waits in an all_reduce from blocks.1 forward of step 1, a collective
rank 0's step 1 does not have, while rank 0 waits in the DDP bucket all_reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from repro._base import ResidualMLP, TinyLM


class StatisticCheckedBlock(ResidualMLP):
    """A healthy block plus the defect: a collective only some ranks issue."""

    def __init__(self, dim: int, trip_rank: int, trip_step: int):
        super().__init__(dim)
        self.trip_rank, self.trip_step = trip_rank, trip_step
        self.calls = 0
        self.metrics_group = dist.new_group(backend="gloo") if dist.is_initialized() else None

    def check_fires(self) -> bool:
        return (self.metrics_group is not None and dist.get_rank() == self.trip_rank
                and self.calls == self.trip_step)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.check_fires():
            flagged = torch.ones(1)
            dist.all_reduce(flagged, group=self.metrics_group)  # the others never join
        if self.training:
            self.calls += 1
        return super().forward(x)


def make(n_layers: int = 3, trip_rank: int = 1, trip_step: int = 1) -> nn.Module:
    blocks: list[nn.Module] = [ResidualMLP(32) for _ in range(n_layers)]
    blocks[1 if n_layers > 1 else 0] = StatisticCheckedBlock(32, trip_rank, trip_step)
    return TinyLM(blocks)
