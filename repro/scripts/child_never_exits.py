"""Defect: the parent waits for a child that waits for the parent.

A plain training script (no nsadiag import). Before training it deduplicates its text
records with the system `sort -u`: it writes every record to the child's stdin and waits
for the child to exit, but never closes the child's stdin. `sort` reads until end of file,
which never comes while the parent holds the pipe's write end, and the parent waits for
`sort` to exit.

Expected verdict: DEADLOCK; the wait chain: the main thread waits for child `sort -u`,
which is blocked reading its stdin, a pipe whose write end this process holds:

    nsadiag run --stall-timeout 5 -- python repro/scripts/child_never_exits.py
"""

import subprocess

import torch
from torch import nn


def unique_records(records: list[str]) -> list[str]:
    sorter = subprocess.Popen(["sort", "-u"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    for record in records:
        sorter.stdin.write(record + "\n")
    sorter.stdin.flush()
    sorter.wait()  # waits for sort, which waits for the end of its input
    return sorter.stdout.read().splitlines()


def main() -> None:
    records = [f"{i % 50} {(i * 7) % 13}" for i in range(400)]
    unique = unique_records(records)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.tensor([[float(v) for v in r.split()] for r in unique])
    for step in range(20):
        loss = model(data).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
