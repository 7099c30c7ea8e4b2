"""Defect: the parent joins a child before reading the queue the child's result is on.

A plain training script (no nsadiag import). Before training, a spawned child tokenizes
the corpus and puts the token ids on a `multiprocessing.Queue`; the parent calls
`worker.join()` and only then `results.get()`. The ids are far larger than a pipe holds:
the queue's feeder thread in the child blocks writing them into the pipe, the child cannot
exit until its feeder has flushed, and the parent, in `join()`, never reads.

Expected verdict: DEADLOCK; the wait chain: the main thread waits for the child to exit,
whose feeder thread is blocked writing into a pipe this process holds the read end of and
does not read; Next: read the queue (`results.get()`) before `join()`:

    nsadiag run --stall-timeout 5 -- python repro/scripts/result_queue_joined_first.py
"""

import multiprocessing as mp

import torch
from torch import nn


def tokenize(lines: list[str], results: "mp.Queue[list[int]]") -> None:
    ids = [hash(word) % 30000 for line in lines for word in line.split()]
    results.put(ids)


def main() -> None:
    lines = [f"sample {i} of the corpus with some words in it" for i in range(40000)]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    worker = ctx.Process(target=tokenize, args=(lines, results), name="tokenizer")
    worker.start()
    worker.join()  # the child cannot end before its result has been read
    ids = torch.tensor(results.get())
    model = nn.Embedding(30000, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(50):
        loss = model(ids[step * 64:(step + 1) * 64]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("trained")


if __name__ == "__main__":
    main()
