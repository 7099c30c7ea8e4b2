"""Defect: an evaluation run in a child forked after training waits forever inside its
first layer.

A plain training script (no nsadiag import). The parent trains a small MLP for a few
steps, which starts torch's intra-op thread pool (OpenMP), then evaluates the model in a
child made with the `fork` start method, which puts its result on a
`multiprocessing.Queue`. A fork copies only the thread that called it: in the child the
pool still believes its worker threads exist, and the child's first parallel op (the
`Linear` layer's matmul) waits for them forever. The parent waits in `q.get()`.

Expected verdict: DEADLOCK; the wait chain: the main thread waits for an item from the
multiprocessing queue, the forked child waits inside `Linear.forward` called at its
`model(...)` line, and the intra-op thread pool was not copied by the fork; Next: start the
child with the "spawn" start method, or call `torch.set_num_threads(1)` in the child before
its first op:

    nsadiag run --stall-timeout 5 -- python repro/scripts/eval_in_forked_child.py
"""

import multiprocessing as mp

import torch
from torch import nn

model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def evaluate(results) -> None:
    with torch.no_grad():
        logits = model(torch.randn(256, 512))
    results.put(float(logits.softmax(-1).max(-1).values.mean()))


def main() -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _step in range(20):
        loss = model(torch.randn(256, 512)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=evaluate, args=(results,))
    child.start()
    print(f"mean confidence {results.get(timeout=600):.3f}", flush=True)
    child.join()


if __name__ == "__main__":
    main()
