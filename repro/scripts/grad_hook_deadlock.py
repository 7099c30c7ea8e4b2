"""Defect: a gradient hook takes a lock that the training loop already holds.

A plain training script (no nsadiag import). The loop guards its step with a
`threading.Lock` (the same lock a metrics thread would use); from the second step on, a
gradient hook on the first layer's weight records a gradient norm under that lock. On a
CPU, autograd runs the hook on the thread that called backward, which holds the lock, and
`threading.Lock` is not reentrant: the backward waits for itself forever, using no CPU.

Expected verdict: DEADLOCK, naming the hook's `with stats_lock:` line:

    nsadiag run --stall-timeout 5 -- python repro/scripts/grad_hook_deadlock.py
"""

import threading

import torch
from torch import nn

stats_lock = threading.Lock()
grad_norms: list[float] = []


def record_norm(grad: torch.Tensor) -> None:
    with stats_lock:  # the defect: the training loop holds this lock during backward
        grad_norms.append(float(grad.norm()))


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(20):
        if step == 1:
            model[0].weight.register_hook(record_norm)
        with stats_lock:
            loss = model(torch.randn(16, 32)).pow(2).mean()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
