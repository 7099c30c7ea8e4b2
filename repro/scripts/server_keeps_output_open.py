"""Defect: a background server inherits the output the script captures, so
`subprocess.run` waits for it forever.

A plain training script (no nsadiag import). Before training it starts a metrics server
through a shell command (`... &`, the way a launcher script would) and captures the
command's output to log what it printed. The shell prints its line and exits at once, but
the server it started in the background inherited the shell's stdout, the pipe the
script reads: the read never reaches end of file while the server runs, and
`subprocess.run` never returns, with no CPU used and no error.

Expected verdict: DEADLOCK at the `subprocess.run` line, the wait chain naming the shell
that ended (exit code 0) and the server that holds the pipe's write end, and the next step
to start the server with its output elsewhere:

    nsadiag run -- python repro/scripts/server_keeps_output_open.py
"""

import subprocess
import sys

import torch
from torch import nn

SERVER = "import time; time.sleep(3600)"  # stands for the metrics server


def main() -> None:
    start = f"{sys.executable} -c '{SERVER}' & echo metrics server started"
    started = subprocess.run(start, shell=True, stdout=subprocess.PIPE, text=True)
    print(started.stdout.strip(), flush=True)
    model = nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(10):
        x = torch.randn(8, 16)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
