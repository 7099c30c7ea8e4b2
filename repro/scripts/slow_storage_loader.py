"""Defect: the input pipeline, not the model, sets the pace.

A plain training script (no nsadiag import). Each sample is a record read from a shard on
a slow network filesystem (the read's latency is simulated with a sleep); two DataLoader
workers cannot read as fast as the small model trains, so the main process spends nearly
all of its time waiting for the next batch while its CPU sits idle.

Expected verdict: SLOW at the deadline, data-bound: the share of the main process's time
spent waiting for batches, the workers and their line in `read_record`; the next step is
about the input pipeline (more workers, faster storage, prefetch), never the model:

    nsadiag run --deadline 20 -- python repro/scripts/slow_storage_loader.py
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

READ_LATENCY_S = 0.1  # one record from the shared filesystem


def read_record(shard: int, index: int, length: int) -> list[int]:
    time.sleep(READ_LATENCY_S)  # waiting on the network filesystem
    generator = torch.Generator().manual_seed(shard * 100_003 + index)
    return torch.randint(0, 1000, (length + 1,), generator=generator).tolist()


class ShardedTextDataset(Dataset):
    def __init__(self, shards: int, per_shard: int, seq_len: int):
        self.shards, self.per_shard, self.seq_len = shards, per_shard, seq_len

    def __len__(self) -> int:
        return self.shards * self.per_shard

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.tensor(read_record(index // self.per_shard, index % self.per_shard,
                                          self.seq_len))
        return tokens[:-1], tokens[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(ShardedTextDataset(8, 512, 32), batch_size=32, shuffle=True,
                        num_workers=args.workers)
    model = nn.Sequential(nn.Embedding(1000, 32), nn.Linear(32, 32), nn.GELU(),
                          nn.Linear(32, 1000))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = 0
    for epoch in range(args.epochs):
        for inputs, targets in loader:
            logits = model(inputs)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
