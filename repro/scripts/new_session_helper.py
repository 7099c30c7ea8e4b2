"""Defect: the script starts helpers that leave its session, and never stops them.

A plain training script (no nsadiag import). Before training it starts a log shipper with
`start_new_session=True` and daemonizes a second helper (fork, `os.setsid()`, fork again,
the middle process exits, so init adopts the grandchild). Both would run for ten minutes
after the script ends: out of reach of a kill of the script's process group.

Expected verdict: OK (the training itself is healthy), and no process left once nsadiag
has given it:

    nsadiag run -- python repro/scripts/new_session_helper.py
"""

import os
import subprocess
import sys
import time

import torch
from torch import nn

# the marker names the helper among all processes on the machine (tests look for it)
HELPER = "import time  # nsadiag repro: log shipper\nwhile True:\n    time.sleep(1)\n"


def daemonize(code: str) -> None:
    """Run `code` in a grandchild in a session of its own, adopted by init."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", code])
        os._exit(0)
    os.wait()


def main() -> None:
    subprocess.Popen([sys.executable, "-c", HELPER], start_new_session=True)
    daemonize(HELPER)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(3):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.5)


if __name__ == "__main__":
    main()
