"""A plain DDP training script for the multi-host straggler test (no nsadiag import): the
rank given by ``--slow-rank`` sleeps ``--slow-s`` seconds before each step's forward (a
slow data shard), so the other ranks wait for it in every step's gradient all_reduce;
``--slow-rank -1`` keeps every rank even.

    torchrun --nnodes 2 --nproc_per_node 2 --rdzv-backend c10d \\
        --rdzv-endpoint host1:29400 tests/multihost_straggler.py --slow-rank 3
"""

import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, required=True)
    parser.add_argument("--slow-s", type=float, default=0.3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=256, help="the hidden layer's width")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, args.width), nn.Tanh(),
                                                  nn.Linear(args.width, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        if rank == args.slow_rank:
            time.sleep(args.slow_s)
        loss = model(torch.randn(args.width // 8, 64) + rank).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
