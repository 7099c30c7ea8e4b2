"""Defect: one rank polls for a file that is never written, and the others wait for it.

A plain DDP training script (no nsadiag import), launched with

    torchrun --standalone --nproc_per_node 2 repro/scripts/ddp_rank_polls_file.py

Each rank reads its own data shard; the shard of the last rank is "still being copied", so
before its first step that rank polls for the copy's marker file in a sleep loop with no
timeout. The marker never appears: that rank never issues a collective, and the other
ranks wait in the first step's gradient all_reduce.

Expected verdict (gloo on a CPU): STALL-COLLECTIVE; the chain: rank 0 waits in the
all_reduce, the last rank never issued it and polls `not os.path.exists(marker)`; Next:
add a timeout to that loop (never "the collective runs on some ranks only"):

    nsadiag run --stall-timeout 10 -- torchrun --standalone --nproc_per_node 2 \\
        repro/scripts/ddp_rank_polls_file.py
"""

import os
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def wait_for_shard(rank: int, world: int) -> None:
    if rank != world - 1:
        return
    marker = os.path.join(tempfile.gettempdir(), f"shard-{rank}-{os.getppid()}.done")
    while not os.path.exists(marker):
        time.sleep(0.5)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.Tanh(),
                                                  nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    wait_for_shard(rank, world)
    for step in range(10):
        loss = model(torch.randn(8, 32) + rank).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sys.stdout.write(f"rank {rank} step {step} loss {loss.item():.4f}\n")
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
