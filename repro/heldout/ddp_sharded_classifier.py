"""Data-parallel training of a small classifier with torchrun (gloo backend, 2
ranks): each rank reads its own shard of synthetic data, wraps the model in
DistributedDataParallel, and calls dist.barrier() at the end before rank 0
saves the weights. Each batch passes a sanity check in train(); a batch with
non-finite features is treated as corrupt. The defect: on rank 1 the shard
contains such a batch at step 3, and train() just `return`s early on that rank,
which then enters the final dist.barrier() while rank 0 keeps training and
blocks in the DDP backward all-reduce for step 3; the two ranks sit in
mismatched collectives forever.

Expected verdict: STALL-COLLECTIVE
Run: nsadiag run --stall-timeout 8 -- torchrun --standalone --nproc_per_node 2 repro/heldout/ddp_sharded_classifier.py
Cause words: early return | returns early | barrier | bad batch
Next words: skip the batch on all ranks | all_reduce the flag | agree across ranks | continue instead of return
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_shard(rank, steps, batch=64):
    g = torch.Generator().manual_seed(rank)
    xs = [torch.randn(batch, 32, generator=g) for _ in range(steps)]
    ys = [(x[:, 0] > 0).long() for x in xs]
    if rank == 1:
        xs[3][5, 7] = float("nan")
    return list(zip(xs, ys))


def train(model, opt, shard, rank):
    for step, (x, y) in enumerate(shard):
        if not torch.isfinite(x).all():
            print(f"[rank {rank}] bad batch at step {step}, stopping", flush=True)
            return
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"[rank {rank}] step {step} loss={loss.item():.4f}", flush=True)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    shard = make_shard(rank, steps=50)
    train(model, opt, shard, rank)
    dist.barrier()
    if rank == 0:
        torch.save(model.module.state_dict(), os.devnull)
        print("saved", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
