"""Defect: a two-rank training script started as one plain process waits forever for the
second rank in `init_process_group`.

A plain training script (no nsadiag import) written for two workers: it reads `RANK` and
`WORLD_SIZE` from the environment with defaults of 0 and 2 and joins a TCP rendezvous.
Started with `python` instead of `torchrun --nproc_per_node 2`, nothing starts rank 1, and
`init_process_group` waits for it (for its default timeout of 30 minutes) before the first
step.

Expected verdict: DEADLOCK; the wait chain: the main thread waits in torch.distributed's
`init_process_group` for every rank of the group to join, and no other process of the job
ran; Next: start every rank (`torchrun --nproc_per_node N`), or pass the world size of the
ranks really started:

    nsadiag run --stall-timeout 5 -- python repro/scripts/rendezvous_missing_rank.py
"""

import os
import socket

import torch
import torch.distributed as dist
from torch import nn


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "2"))
    port = os.environ.get("MASTER_PORT") or str(free_port())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
