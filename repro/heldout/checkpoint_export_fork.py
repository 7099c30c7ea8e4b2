"""Trains a small MLP and, every 25 steps, exports a checkpoint in a forked
child process (multiprocessing with the "fork" start method) so that the
export's serialisation does not touch the parent's state; both the trainer
and the export worker record artifacts in a shared in-memory registry guarded
by REGISTRY_LOCK, and the parent waits for the export with proc.join(). The
defect: export_checkpoint() starts the child while it still holds
REGISTRY_LOCK, so the child inherits a copy of the lock in the locked state;
when _export_worker() calls register_artifact() it blocks on that lock, which
nothing in the child will ever release, and the parent waits in join()
forever.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/checkpoint_export_fork.py
Cause words: REGISTRY_LOCK | fork | register_artifact | export_checkpoint
Next words: start the process after releasing | outside the lock | spawn | forkserver
"""
import io
import multiprocessing as mp
import threading

import torch
import torch.nn as nn

REGISTRY_LOCK = threading.Lock()
REGISTRY = {}
CTX = mp.get_context("fork")


def register_artifact(key, size):
    with REGISTRY_LOCK:
        REGISTRY[key] = size


def _export_worker(state, step):
    buf = io.BytesIO()
    torch.save(state, buf)
    register_artifact(f"export-{step}", buf.tell())


def export_checkpoint(model, step):
    with REGISTRY_LOCK:
        REGISTRY[f"ckpt-{step}"] = "pending"
        proc = CTX.Process(target=_export_worker, args=(model.state_dict(), step))
        proc.start()
    proc.join()
    print(f"export for step {step} finished rc={proc.exitcode}", flush=True)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 201):
        x = torch.randn(64, 64)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step} loss={loss.item():.4f}, exporting", flush=True)
            export_checkpoint(model, step)


if __name__ == "__main__":
    main()
