"""Defect: a lock held across `Queue.put` on a bounded queue.

A plain training script (no nsadiag import). A loader thread prepares batches and, to keep
its counter consistent with the queue, puts each one while holding `state_lock`. The
training loop takes `state_lock` to read the counter before it takes a batch. Once the
queue is full the loader waits in `put()` with the lock held, and the training loop waits
for the lock: neither moves.

Expected verdict: DEADLOCK; the wait chain: the main thread waits for `state_lock`, held
by the thread `loader`, which waits in `Queue.put` on the full queue:

    nsadiag run --stall-timeout 5 -- python repro/scripts/lock_across_queue_put.py
"""

import queue
import threading
import time

import torch
from torch import nn

state_lock = threading.Lock()
prepared = 0


def load_batches(batches: queue.Queue) -> None:
    global prepared
    for _ in range(1000):
        batch = torch.randn(8, 16)
        with state_lock:
            batches.put(batch)
            prepared += 1


def main() -> None:
    torch.manual_seed(0)
    batches: queue.Queue = queue.Queue(maxsize=4)
    threading.Thread(target=load_batches, args=(batches,), name="loader", daemon=True).start()
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    time.sleep(0.5)  # let the loader fill the queue first
    for step in range(1000):
        with state_lock:
            ahead = prepared - step
        batch = batches.get()
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f} ({ahead} batches ahead)", flush=True)


if __name__ == "__main__":
    main()
