"""Defect: the thread that feeds the training loop dies, and the loop waits for it forever.

A plain training script (no nsadiag import). A producer thread parses text records into
token batches and puts them on a `queue.Queue`; the training loop takes them with a
blocking `get()`. One record is malformed: the producer raises, the exception is printed by
the thread machinery and the thread ends, but nothing tells the main thread, which then
waits in `get()` for a batch that never comes.

Expected verdict: DEADLOCK at the loop's `batches.get()` line, quoting the producer's
exception (ValueError from `parse`) as the cause:

    nsadiag run --stall-timeout 5 -- python repro/scripts/producer_thread_dies.py
"""

import queue
import threading

import torch
from torch import nn

SEQ_LEN = 64


def records(n: int):
    for i in range(n):
        yield "corrupt" if i == 5 else " ".join(str((i * 7 + j) % 256) for j in range(SEQ_LEN + 1))


def parse(record: str) -> torch.Tensor:
    return torch.tensor([int(token) for token in record.split()])  # the defect's trigger


def produce(batches: queue.Queue, n: int) -> None:
    for record in records(n):
        batches.put(parse(record).unsqueeze(0))
    batches.put(None)


def main() -> None:
    torch.manual_seed(0)
    batches: queue.Queue = queue.Queue(maxsize=4)
    threading.Thread(target=produce, args=(batches, 200), name="producer", daemon=True).start()
    model = nn.Sequential(nn.Embedding(256, 64), nn.Linear(64, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    while True:
        batch = batches.get()  # waits forever once the producer is gone
        if batch is None:
            break
        loss = nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1),
                                           batch[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.3f}", flush=True)
        step += 1


if __name__ == "__main__":
    main()
