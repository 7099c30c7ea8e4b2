"""Runs evaluation in a separate process: the parent trains a small model for a
few steps, then starts a multiprocessing.Process that computes embeddings for
the validation set and sends the resulting tensor back through a
multiprocessing.Queue. The defect: the parent calls worker.join() before
result_q.get(); the child's payload is several MB, so the queue's feeder thread
cannot flush it into the pipe until someone reads, the child never exits, and
join() waits forever.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/eval_worker_process.py
Cause words: join | result_q | Queue | run_eval
Next words: get() before join | read the queue before | get before join
"""
import multiprocessing as mp

import numpy as np
import torch
import torch.nn as nn


def run_eval(state_dict, result_q):
    model = nn.Linear(128, 256)
    model.load_state_dict(state_dict)
    with torch.no_grad():
        feats = model(torch.randn(8192, 128))
    result_q.put(feats.numpy())


def main():
    model = nn.Linear(128, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(20):
        x = torch.randn(32, 128)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"trained, loss={loss.item():.4f}; starting eval worker", flush=True)

    result_q = mp.Queue()
    worker = mp.Process(target=run_eval, args=(model.state_dict(), result_q))
    worker.start()
    worker.join()
    feats = result_q.get()
    print("eval embeddings", feats.shape, float(np.abs(feats).mean()))


if __name__ == "__main__":
    main()
