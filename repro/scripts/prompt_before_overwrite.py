"""Not a defect of the code: the script asks before it overwrites a checkpoint, and nobody
answers.

A plain training script (no nsadiag import). Before training it finds the checkpoint of a
previous run and asks at the terminal whether to overwrite it; launched in a terminal and
left alone (or under a wrapper that keeps the terminal), it waits for the answer with no
CPU used, which looks like a hang.

Expected in a terminal: no stall is called while the prompt waits for its answer (the
live status line says it waits for an answer typed at the terminal); answered, the run
goes on and ends OK:

    nsadiag run -- python repro/scripts/prompt_before_overwrite.py
"""

import os
import tempfile

import torch
from torch import nn


def main() -> None:
    checkpoint = os.path.join(tempfile.gettempdir(), "prompt_before_overwrite.pt")
    model = nn.Linear(16, 16)
    torch.save(model.state_dict(), checkpoint)  # the previous run's
    if os.path.exists(checkpoint):
        answer = input(f"{checkpoint} exists; overwrite it? [y/N] ")
        if answer.strip().lower() != "y":
            print("keeping the old checkpoint", flush=True)
            return
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(10):
        x = torch.randn(8, 16)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    torch.save(model.state_dict(), checkpoint)


if __name__ == "__main__":
    main()
