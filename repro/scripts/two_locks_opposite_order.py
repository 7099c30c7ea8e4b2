"""Defect: two threads take the same two locks in opposite order.

A plain training script (no nsadiag import). The training loop updates the model under
`model_lock` and then records its loss under `stats_lock`; a logging thread snapshots the
statistics under `stats_lock` and then reads the weights' norm under `model_lock`. Each
thread ends up holding the lock the other one waits for.

Expected verdict: DEADLOCK; the wait chain names both threads: the main thread waits for
`stats_lock` inside `with model_lock:`, and `stats_lock` is held by the thread `logger`,
which waits for `model_lock`:

    nsadiag run --stall-timeout 5 -- python repro/scripts/two_locks_opposite_order.py
"""

import threading
import time

import torch
from torch import nn

model_lock = threading.Lock()
stats_lock = threading.Lock()
losses: list[float] = []


def log_statistics(model: nn.Module, stop: threading.Event) -> None:
    while not stop.is_set():
        with stats_lock:
            recent = losses[-10:]
            time.sleep(0.05)  # format the line
            with model_lock:
                norm = sum(p.norm().item() for p in model.parameters())
        print(f"recent {len(recent)} losses, weight norm {norm:.3f}", flush=True)


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stop = threading.Event()
    threading.Thread(target=log_statistics, args=(model, stop), name="logger",
                     daemon=True).start()
    for step in range(500):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        with model_lock:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            time.sleep(0.05)  # let the weights settle before logging
            with stats_lock:
                losses.append(loss.item())
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    stop.set()


if __name__ == "__main__":
    main()
