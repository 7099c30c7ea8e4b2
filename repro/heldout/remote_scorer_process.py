"""Scores a trained model's predictions in a separate worker process started
with the "spawn" multiprocessing context and connected by
multiprocessing.Pipe(). The parent trains a small regressor, starts
scorer_main() in a multiprocessing.Process, and then calls conn.recv() to
wait for the scorer's "ready" handshake before it sends the weights. The
defect: scorer_main() is written to wait for the parent first - its first
call is also conn.recv(), expecting the model weights - so each side blocks
in recv() waiting for the other to send, and the parent's handshake protocol
never starts. Both processes sleep in a read on the pipe and use no CPU.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/remote_scorer_process.py
Cause words: conn.recv | Pipe | scorer_main | handshake | both sides wait
Next words: send before recv | child sends ready first | conn.poll with timeout | agree on who sends first | send the weights first
"""
import multiprocessing as mp

import torch
import torch.nn as nn


def make_model():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def scorer_main(conn):
    state = conn.recv()
    model = make_model()
    model.load_state_dict(state)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1000, 8, generator=g)
    with torch.no_grad():
        mse = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).item()
    conn.send({"mse": mse})
    conn.close()


def train(steps=100):
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        x = torch.randn(64, 8)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"trained, final loss {loss.item():.4f}", flush=True)
    return model


def main():
    model = train()
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    scorer = ctx.Process(target=scorer_main, args=(child_conn,), name="scorer")
    scorer.start()
    print("waiting for scorer to come up...", flush=True)
    hello = parent_conn.recv()
    assert hello == "ready", hello
    parent_conn.send(model.state_dict())
    result = parent_conn.recv()
    print(f"held-out mse {result['mse']:.4f}")
    scorer.join()


if __name__ == "__main__":
    main()
