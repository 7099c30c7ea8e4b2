"""Defect: a dataset recomputes a statistic of the whole dataset for every item it returns.

A plain training script (no nsadiag import). `SensorWindows.__getitem__` normalises its
window by the mean and standard deviation of every reading in the dataset, computed again
for each item (`self.stats()`), in Python over all the readings: each batch costs the whole
dataset times the batch size, while the model's own step is tiny. The DataLoader has no
workers, so the main thread does it between steps.

Expected verdict: SLOW; the cause is the per-item statistic in `stats` called from
`__getitem__`, not the model; Next: compute the statistic once (in `__init__`) and reuse it;
more DataLoader workers would only spread the same waste:

    nsadiag run --deadline 20 -- python repro/scripts/normalize_per_item.py
"""

import math
import random

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SensorWindows(Dataset):
    def __init__(self, readings: list[float], window: int) -> None:
        self.readings, self.window = readings, window

    def __len__(self) -> int:
        return len(self.readings) - self.window

    def stats(self) -> tuple[float, float]:
        mean = sum(self.readings) / len(self.readings)
        var = sum((r - mean) ** 2 for r in self.readings) / len(self.readings)
        return mean, math.sqrt(var)

    def __getitem__(self, index: int) -> torch.Tensor:
        mean, std = self.stats()  # the whole dataset, again, for every item
        window = self.readings[index:index + self.window]
        return torch.tensor([(r - mean) / std for r in window])


def main() -> None:
    random.seed(0)
    readings = [random.gauss(20.0, 3.0) for _ in range(60_000)]
    loader = DataLoader(SensorWindows(readings, 32), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _epoch in range(10):
        for batch in loader:
            loss = model(batch).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print("trained")


if __name__ == "__main__":
    main()
