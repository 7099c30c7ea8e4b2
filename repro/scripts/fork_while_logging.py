"""Defect: a child forked while another thread holds a lock waits for that lock forever.

A plain training script (no nsadiag import). A background thread writes the running
metrics to a file under `METRICS_LOCK` every few milliseconds. Every few steps the main
thread saves an evaluation in a child made with the `fork` start method; the child's work
ends by writing its own line under the same lock. The fork copies the lock in the state it
had at that instant, and when the writer thread held it, it stays locked in the child for
good: no thread of the child will ever release it (the writer thread was not copied). The
main thread waits in `proc.join()` for a child that never ends.

Expected verdict: DEADLOCK; the wait chain: the main thread waits for the forked child,
whose main thread waits for `METRICS_LOCK`, held by no thread of the child (it was locked
when the process was forked); Next: start the child with the "spawn" start method, or
take the lock around the fork:

    nsadiag run --stall-timeout 5 -- python repro/scripts/fork_while_logging.py
"""

import multiprocessing as mp
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch import nn

METRICS_LOCK = threading.Lock()
METRICS = Path(tempfile.gettempdir()) / "fork_while_logging.metrics"


def metrics_writer(stop: threading.Event) -> None:
    while not stop.is_set():
        with METRICS_LOCK:
            with METRICS.open("a") as out:  # the lock is held across the file's I/O
                out.write(f"{time.time():.3f}\n")
            time.sleep(0.002)


def evaluate(weights: torch.Tensor) -> None:
    score = float(weights.abs().mean())
    with METRICS_LOCK:
        with METRICS.open("a") as out:
            out.write(f"eval {score:.4f}\n")


def main() -> None:
    stop = threading.Event()
    threading.Thread(target=metrics_writer, args=(stop,), name="metrics", daemon=True).start()
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    fork = mp.get_context("fork")
    for step in range(400):
        x = torch.randn(32, 16)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            proc = fork.Process(target=evaluate, args=(model.weight.detach().clone(),))
            proc.start()
            proc.join()
    stop.set()
    print("trained")


if __name__ == "__main__":
    main()
