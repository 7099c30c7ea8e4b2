"""Defect: a loader thread dies before it reaches the barrier the others wait at.

A plain training script (no nsadiag import). Each epoch, one loader thread per shard fills
its slice of the batch buffer, and the loaders and the main thread meet at a
`threading.Barrier` sized for every shard and the main thread before training on it. One
shard's file is missing: its loader raises `FileNotFoundError` before its first
`wait()`, so the barrier never gets its last party and every other thread waits at it for
good.

Expected verdict: DEADLOCK; the wait chain: the main thread waits at the barrier
`epoch_ready`, every live thread waits there, and the loader that died of
FileNotFoundError is the party that never arrives; Next: fix that exception, and have a
loader `abort()` the barrier in a `finally` (or `wait(timeout=...)`), so that the others
raise BrokenBarrierError:

    nsadiag run --stall-timeout 5 -- python repro/scripts/shard_barrier_party_died.py
"""

import tempfile
import threading
from pathlib import Path

import torch
from torch import nn

ROOT = Path(tempfile.mkdtemp(prefix="shards-"))
SHARDS = ["train-0.pt", "train-1.pt", "train-2.pt"]
ROWS = 64
for name in SHARDS[:-1]:  # the last shard was never written
    torch.save(torch.randn(ROWS, 32), ROOT / name)

buffer = torch.empty(len(SHARDS) * ROWS, 32)
epoch_ready = threading.Barrier(len(SHARDS) + 1)  # every loader, and the main thread


def load(index: int, name: str) -> None:
    shard = torch.load(ROOT / name)
    for _epoch in range(3):
        buffer[index * ROWS:(index + 1) * ROWS] = shard
        epoch_ready.wait()


def main() -> None:
    loaders = [threading.Thread(target=load, args=(i, name), name=f"loader-{i}", daemon=True)
               for i, name in enumerate(SHARDS)]
    for loader in loaders:
        loader.start()
    model = nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        epoch_ready.wait()
        loss = model(buffer).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
