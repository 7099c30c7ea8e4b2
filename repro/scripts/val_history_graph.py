"""Defect: the loop keeps each step's validation loss tensor, and with it its graph.

A plain training script (no nsadiag import). Every step it computes a validation loss
with autograd on (no `torch.no_grad()`) and appends the tensor to `history` for a smoothed
log line. Each kept tensor holds its graph and every activation saved for a backward that
never comes, so memory grows by the same amount every step until the allocator fails. The
allocation happens in the validation forward; what keeps it is the `append`.

Expected verdict, under a memory limit (a job scheduler's, or `ulimit -v`): OOM, blaming
`history.append(val_loss)` (the container that retains), with the growth per step, and
the Next "store `.item()` or a detached tensor":

    nsadiag run -- bash -c 'ulimit -v 2000000; exec python repro/scripts/val_history_graph.py'
"""

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    val_x = torch.randn(1024, 512)
    history = []
    for step in range(10_000):
        x = torch.randn(64, 512)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        val_loss = (model(val_x) - val_x).pow(2).mean()
        history.append(val_loss)
        smoothed = sum(v.item() for v in history[-20:]) / min(20, len(history))
        print(f"step {step} loss {loss.item():.4f} val {smoothed:.4f}", flush=True)


if __name__ == "__main__":
    main()
