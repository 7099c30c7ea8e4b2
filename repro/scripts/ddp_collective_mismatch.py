"""Defect: one rank issues an all_reduce on the default group that the other ranks never issue.

A plain DDP training script (no nsadiag import), launched with

    torchrun --standalone --nproc_per_node 2 repro/scripts/ddp_collective_mismatch.py

A debugging helper sums a statistic over all ranks; it was meant to run on every rank, but
a condition that holds on one shard only (pinned here to rank 1 at step 3) calls it on rank
1 alone. Its 4-byte all_reduce goes out on the default process group while rank 0 is in
DDP's gradient all_reduce of the same step, so the two ranks' collectives meet with
different sizes: gloo aborts rank 1 ("Received data size doesn't match expected size"),
the process dies of SIGABRT, and torchrun ends the job.

Expected verdict (gloo on a CPU): CRASH of rank 1, explained by the collective mismatch:
rank 1's all_reduce of 4 bytes from `debug_stat` met rank 0's DDP gradient all_reduce:

    nsadiag run --stall-timeout 10 -- torchrun --standalone --nproc_per_node 2 \\
        repro/scripts/ddp_collective_mismatch.py
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def debug_stat(value: float) -> float:
    total = torch.tensor([value])
    dist.all_reduce(total)  # the defect: called on one rank only
    return total.item()


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.Tanh(),
                                                  nn.Linear(128, 8)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10):
        batch = torch.randn(16, 64) + rank
        loss = model(batch).pow(2).mean()
        if rank == 1 and step == 3 and loss.item() > 0:  # a shard-dependent condition
            sys.stdout.write(f"rank {rank} step {step} sum {debug_stat(loss.item()):.4f}\n")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sys.stdout.write(f"rank {rank} step {step} loss {loss.item():.4f}\n")
        sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
