"""A plain DDP training script for the multi-host tests (no nsadiag import): the rank
given by ``--stuck-rank`` polls for its data shard's marker in its host's /tmp before its
first step, in a sleep loop with no timeout, outside any collective; the marker never
appears, and every other rank waits in the first step's gradient all_reduce.

    torchrun --nnodes 2 --nproc_per_node 2 --rdzv-backend c10d \\
        --rdzv-endpoint host1:29400 tests/multihost_train.py --stuck-rank 3
"""

import argparse
import os
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def wait_for_shard(rank: int, stuck: int) -> None:
    if rank != stuck:
        return
    marker = os.path.join(tempfile.gettempdir(), f"shard-{rank}.done")
    while not os.path.exists(marker):
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stuck-rank", type=int, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.Tanh(),
                                                  nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    wait_for_shard(rank, args.stuck_rank)
    for step in range(5):
        loss = model(torch.randn(4, 16) + rank).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sys.stdout.write(f"rank {rank} step {step} loss {loss.item():.4f}\n")
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
