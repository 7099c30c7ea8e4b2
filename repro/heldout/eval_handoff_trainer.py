"""Two-stage training of a small MLP classifier that evaluates the stage-1
weights in a background evaluator thread while stage 2 runs. The hand-off
goes through a threading.Condition: after stage 1 the main thread stores a
copy of the state_dict in shared["state"] and calls snapshot_ready.notify()
under the condition, then starts the evaluator thread, runs stage 2, and
finally calls evaluator.join() to collect the result. run_evaluator() builds
its validation set, takes the condition and calls snapshot_ready.wait() to be
told that the snapshot is available. The defect is a lost wakeup: notify()
was called before the evaluator thread even existed, so nobody was waiting
and the notification is lost; the evaluator's wait() has no predicate loop
(it never checks whether shared["state"] is already set) and no timeout, so
it sleeps forever, and the main thread blocks in evaluator.join(). Both
threads are asleep, using no CPU.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/eval_handoff_trainer.py
Cause words: snapshot_ready | Condition | lost wakeup | notify | run_evaluator
Next words: wait_for | predicate | while shared["state"] is None | threading.Event | timeout
"""
import threading

import torch
import torch.nn as nn

IN_DIM = 64
N_CLASSES = 10


def make_model():
    return nn.Sequential(nn.Linear(IN_DIM, 128), nn.ReLU(), nn.Linear(128, N_CLASSES))


def make_val_set(n_batches=50, batch=256):
    g = torch.Generator().manual_seed(123)
    return [(torch.randn(batch, IN_DIM, generator=g),
             torch.randint(0, N_CLASSES, (batch,), generator=g)) for _ in range(n_batches)]


@torch.no_grad()
def evaluate(model, val_set):
    total = 0.0
    for x, y in val_set:
        total += nn.functional.cross_entropy(model(x), y).item()
    return total / len(val_set)


def run_evaluator(shared, snapshot_ready, results):
    val_set = make_val_set()
    model = make_model()
    with snapshot_ready:
        snapshot_ready.wait()
        model.load_state_dict(shared["state"])
    results["stage1_val_loss"] = evaluate(model, val_set)
    print(f"[eval] stage-1 val loss {results['stage1_val_loss']:.4f}", flush=True)


def train_steps(model, opt, n_steps):
    for _ in range(n_steps):
        x = torch.randn(64, IN_DIM)
        y = torch.randint(0, N_CLASSES, (64,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def main():
    torch.manual_seed(0)
    shared = {"state": None}
    results = {}
    snapshot_ready = threading.Condition()

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    print(f"[train] stage 1 done, loss {train_steps(model, opt, 30):.4f}", flush=True)
    with snapshot_ready:
        shared["state"] = {k: v.clone() for k, v in model.state_dict().items()}
        snapshot_ready.notify()

    evaluator = threading.Thread(target=run_evaluator, args=(shared, snapshot_ready, results), name="evaluator")
    evaluator.start()

    for group in opt.param_groups:
        group["lr"] = 0.01
    print(f"[train] stage 2 done, loss {train_steps(model, opt, 30):.4f}", flush=True)

    evaluator.join()
    print(f"[train] results: {results}")


if __name__ == "__main__":
    main()
