"""Defect: the training loop polls for a file that is never written, with no timeout.

A plain training script (no nsadiag import). After each epoch the script waits for an
evaluation service to drop `eval-done-<epoch>.json` beside the checkpoint before it goes
on; here the service is not running, so the file never appears and the loop sleeps and
checks forever.

Expected verdict: DEADLOCK (an idle wait that never ends); the wait chain names the
polling loop and what it polls (`os.path.exists(marker)`), and Next says to add a timeout:

    nsadiag run --stall-timeout 5 -- python repro/scripts/poll_for_file.py
"""

import os
import tempfile
import time

import torch
from torch import nn


def wait_for_evaluation(marker: str) -> None:
    while not os.path.exists(marker):
        time.sleep(0.2)


def main() -> None:
    torch.manual_seed(0)
    out = tempfile.mkdtemp(prefix="ckpt-")
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        for step in range(5):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
        torch.save(model.state_dict(), os.path.join(out, f"epoch-{epoch}.pt"))
        wait_for_evaluation(os.path.join(out, f"eval-done-{epoch}.json"))


if __name__ == "__main__":
    main()
