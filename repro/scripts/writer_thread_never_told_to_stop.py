"""Defect: the training loop hands its metrics to a writer thread and, at the end, joins the
thread without telling it to stop.

A plain training script (no nsadiag import). A background thread writes each step's
metrics to a CSV file so the loop never waits on the disk; it takes records from a queue
and stops at a `None` sentinel. The loop finishes its steps and calls `writer.join()`, but
the sentinel is never put, so the writer waits for a record that will never come and the
join waits for the writer: the run hangs after its last step with no error.

Expected verdict: DEADLOCK at the join, the wait chain going into the writer thread and its
`records.get()`, and the next step to put the sentinel (or wait with a timeout):

    nsadiag run -- python repro/scripts/writer_thread_never_told_to_stop.py
"""

import csv
import os
import queue
import tempfile
import threading

import torch
from torch import nn


def write_metrics(records: queue.Queue, path: str) -> None:
    with open(path, "w", newline="") as handle:
        out = csv.writer(handle)
        while True:
            record = records.get()
            if record is None:
                return
            out.writerow(record)
            handle.flush()


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    records: queue.Queue = queue.Queue()
    path = os.path.join(tempfile.mkdtemp(), "metrics.csv")
    writer = threading.Thread(target=write_metrics, args=(records, path), name="metrics")
    writer.start()
    for step in range(50):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        records.put((step, loss.item()))
    print(f"trained 50 steps, metrics in {path}", flush=True)
    writer.join()  # the defect: records.put(None) was never called


if __name__ == "__main__":
    main()
