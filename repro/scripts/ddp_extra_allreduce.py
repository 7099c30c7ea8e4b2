"""Defect: one rank issues an all_reduce that the other ranks never issue.

A plain DDP training script (no nsadiag import), launched with

    torchrun --standalone --nproc_per_node 2 repro/scripts/ddp_extra_allreduce.py

Every rank keeps an overflow counter that it sums over a metrics process group when its
batch trips a check; the check stands for a data-dependent condition that holds on one
shard only, and is pinned here to rank 1 at step 2 so the script fails the same way every
time. Rank 1 then waits in that all_reduce, which rank 0 never joins; rank 0 goes on to
step 2's backward and waits in DDP's gradient all_reduce, which rank 1 never reaches.

Expected verdict (gloo on a CPU): STALL-COLLECTIVE naming rank 1 and this file's
`dist.all_reduce(overflow, group=metrics)` line, within the stall timeout plus 30 s:

    nsadiag run --stall-timeout 10 -- torchrun --standalone --nproc_per_node 2 \\
        repro/scripts/ddp_extra_allreduce.py
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

TRIP_RANK, TRIP_STEP = 1, 2


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank = dist.get_rank()
    metrics = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(),
                                                  nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10):
        batch = torch.randn(16, 32) + rank
        if rank == TRIP_RANK and step == TRIP_STEP:  # the check trips on this shard only
            overflow = torch.ones(1)
            dist.all_reduce(overflow, group=metrics)  # the defect: no other rank joins
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        # one write per line: the ranks share stdout, and print's separate newline write
        # could interleave with the other rank's line
        sys.stdout.write(f"rank {rank} step {step} loss {loss.item():.4f}\n")
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
