"""Two-process DistributedDataParallel training of a tiny sensor-reading
regressor, launched with torchrun --nproc_per_node 2 on the gloo backend
(torch.distributed.init_process_group("gloo")). Each rank draws random
(x, y) batches, runs forward/backward through DDP (whose gradient all_reduce
synchronises the ranks every step) and then all_reduces the loss for
logging. check_batch() rejects batches containing a sensor dropout
sentinel. The defect: at step 5 rank 1's batch contains the sentinel, so
check_batch() raises ValueError("bad batch ...") on rank 1 only, while rank 0
goes on into the step-5 backward and its gradient all_reduce. Rank 1 exits
with the traceback and status 1; its gloo connections close, so rank 0's
pending all_reduce fails as well (or torchrun's agent terminates it) within
a second or two, and torchrun exits with status 1 reporting a
ChildFailedError whose root cause is the ValueError on rank 1. The job does
not stay stuck: it ends with an exception.

Expected verdict: ERROR
Run: nsadiag run --stall-timeout 8 -- torchrun --nproc_per_node 2 repro/heldout/ddp_sensor_regressor.py
Cause words: ValueError | bad batch | check_batch | rank 1 | sentinel
Next words: skip the bad batch | filter the data | clean the input | handle the sentinel | agree across ranks
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

SENTINEL = -999.0


def check_batch(x, step):
    if (x == SENTINEL).any():
        raise ValueError(f"bad batch at step {step}: sensor dropout sentinel in input")


def get_batch(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(32, 12, generator=g)
    if rank == 1 and step == 5:
        x[3, 7] = SENTINEL
    y = x[:, :4].sum(1, keepdim=True)
    return x, y


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(50):
        x, y = get_batch(rank, step)
        check_batch(x, step)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        if rank == 0:
            print(f"step {step} loss {avg.item() / world:.4f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print("done, pid", os.getpid())


if __name__ == "__main__":
    main()
