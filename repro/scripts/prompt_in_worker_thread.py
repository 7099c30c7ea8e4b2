"""Not a defect of the code: a preparation thread asks before it deletes a stale cache,
and nobody answers yet.

A plain training script (no nsadiag import). It prepares its data in a thread (so that
a slow preparation could overlap model set-up) and joins it before training. The thread
finds the tokenized cache of a previous run and asks at the terminal whether to rebuild
it; launched in a terminal and left alone for a while, the main thread waits in `join`
with no CPU used, which looks like a hang.

Expected in a terminal: no stall is called while the thread's prompt waits for its
answer; answered, the run goes on and ends OK:

    nsadiag run -- python repro/scripts/prompt_in_worker_thread.py
"""

import os
import tempfile
import threading

import torch
from torch import nn


def prepare(cache: str, ready: dict) -> None:
    if os.path.exists(cache):
        answer = input(f"{cache} exists; rebuild it? [y/N] ")
        if answer.strip().lower() == "y":
            os.remove(cache)
    if not os.path.exists(cache):
        torch.save(torch.randint(0, 100, (64, 16)), cache)
    ready["tokens"] = torch.load(cache)


def main() -> None:
    cache = os.path.join(tempfile.gettempdir(), "prompt_in_worker_thread.pt")
    torch.save(torch.randint(0, 100, (64, 16)), cache)  # the previous run's
    ready: dict = {}
    preparing = threading.Thread(target=prepare, args=(cache, ready), name="prepare")
    preparing.start()
    model = nn.Embedding(100, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    preparing.join()
    for batch in ready["tokens"].split(8):
        loss = model(batch).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print("trained on the cached tokens", flush=True)


if __name__ == "__main__":
    main()
