"""Trains a small MLP classifier in the main thread and hands a snapshot of
its weights to a background evaluator thread through a threading.Condition.
The evaluator first computes a baseline loss over a large synthetic
validation set (about a second of work), then takes the condition and calls
snapshot_ready.wait() to be told that new weights are available. The defect
is a lost wakeup: the trainer finishes its short epoch, publishes the
state_dict and calls snapshot_ready.notify() while the evaluator is still
computing its baseline, i.e. before anyone is waiting. The evaluator's later
wait() has no predicate loop (it never checks whether shared["state"] is
already set) and no timeout, so it sleeps forever, and the main thread blocks
in evaluator.join(). Both threads are asleep, using no CPU.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/eval_handoff_trainer.py
Cause words: snapshot_ready | Condition | lost wakeup | notify | run_evaluator
Next words: wait_for | predicate | while not | check shared["state"] before waiting | timeout
"""
import threading

import torch
import torch.nn as nn

IN_DIM = 64
N_CLASSES = 10


def make_model():
    return nn.Sequential(nn.Linear(IN_DIM, 128), nn.ReLU(), nn.Linear(128, N_CLASSES))


def make_val_set(n_batches=400, batch=512):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(batch, IN_DIM, generator=g),
             torch.randint(0, N_CLASSES, (batch,), generator=g)) for _ in range(n_batches)]


@torch.no_grad()
def evaluate(model, val_set):
    total = 0.0
    for x, y in val_set:
        total += nn.functional.cross_entropy(model(x), y).item()
    return total / len(val_set)


def run_evaluator(shared, snapshot_ready):
    val_set = make_val_set()
    model = make_model()
    baseline = evaluate(model, val_set)
    print(f"[eval] baseline val loss {baseline:.4f}", flush=True)
    with snapshot_ready:
        snapshot_ready.wait()
        model.load_state_dict(shared["state"])
    print(f"[eval] val loss after epoch {evaluate(model, val_set):.4f}", flush=True)


def main():
    torch.manual_seed(0)
    shared = {"state": None}
    snapshot_ready = threading.Condition()
    evaluator = threading.Thread(target=run_evaluator, args=(shared, snapshot_ready), name="evaluator")
    evaluator.start()

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(20):
        x = torch.randn(64, IN_DIM)
        y = torch.randint(0, N_CLASSES, (64,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"[train] epoch done, loss {loss.item():.4f}; publishing snapshot", flush=True)

    with snapshot_ready:
        shared["state"] = {k: v.clone() for k, v in model.state_dict().items()}
        snapshot_ready.notify()

    evaluator.join()
    print("[train] evaluation finished")


if __name__ == "__main__":
    main()
