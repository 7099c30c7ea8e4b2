"""Defect: the ranks get different numbers of batches.

A plain DDP training script (no nsadiag import), launched with

    torchrun --standalone --nproc_per_node 2 repro/scripts/ddp_uneven_data.py

The script shards its 33 examples by hand, `examples[rank::world]`, without dropping the
remainder: rank 0 gets 17 examples, 5 batches of 4 (the last holds one), and rank 1 gets
16, 4 batches. Rank 1 finishes its 4 steps and waits in the final `dist.barrier()`; rank 0
is in its 5th step's backward, waiting in DDP's gradient all_reduce that rank 1 never
issues.

Expected verdict (gloo on a CPU): STALL-COLLECTIVE, with every rank's step count (rank 0:
4 steps done, in the 5th step's all_reduce; rank 1: 4 steps done, in the barrier) and the
Next "give every rank the same number of steps":

    nsadiag run --stall-timeout 10 -- torchrun --standalone --nproc_per_node 2 \\
        repro/scripts/ddp_uneven_data.py
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

EXAMPLES, BATCH = 33, 4


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    examples = torch.randn(EXAMPLES, 32)
    mine = examples[rank::world]
    batches = [mine[i:i + BATCH] for i in range(0, len(mine), BATCH)]
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(),
                                                  nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, batch in enumerate(batches):
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sys.stdout.write(f"rank {rank} step {step} loss {loss.item():.4f}\n")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
