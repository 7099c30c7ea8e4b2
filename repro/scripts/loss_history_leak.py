"""Defect: the loop keeps every step's validation loss, and with it that forward's graph.

A plain training script (no nsadiag import). To print a smoothed validation loss it
appends each step's validation loss tensor to a list; the validation forward runs with
autograd on (no `torch.no_grad()`), so each kept loss holds its graph and every activation
saved for a backward that never comes. Memory grows by the same amount every step until
the allocator fails.

Expected verdict, under a memory limit (a job scheduler's, or `ulimit -v`): OOM, with the
memory growth per step and the validation line as the frame that keeps allocating:

    nsadiag run -- bash -c 'ulimit -v 2000000; exec python repro/scripts/loss_history_leak.py'
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(),
                          nn.Linear(2048, 512))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    val_x, val_y = torch.randn(1024, 512), torch.randn(1024, 512)
    val_losses = []
    for step in range(10_000):
        x = torch.randn(64, 512)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        val_losses.append((model(val_x) - val_y).pow(2).mean())  # the defect: keeps the graph
        smoothed = sum(v.item() for v in val_losses[-20:]) / min(20, len(val_losses))
        print(f"step {step} loss {loss.item():.4f} val {smoothed:.4f}", flush=True)


if __name__ == "__main__":
    main()
