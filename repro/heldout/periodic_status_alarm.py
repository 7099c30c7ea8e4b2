"""Training loop with a periodic status report: a SIGALRM timer fires every
1 s via signal.setitimer and the handler report_status() prints the current
step and loss, taking state_lock so it reads a consistent snapshot; the main
loop holds state_lock for each training step (forward, backward, optimizer
update) and while it writes the shared training state.
The defect: state_lock is a plain non-reentrant threading.Lock and the signal
handler runs on the main thread, so when the alarm fires while the main loop
is inside `with state_lock:`, the handler blocks trying to acquire a lock its
own thread already holds and the program self-deadlocks forever.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/periodic_status_alarm.py
Cause words: state_lock | report_status | signal handler | SIGALRM
Next words: RLock | do not lock in the signal handler | set a flag | acquire(blocking=False)
"""
import signal
import threading
import time

import torch
import torch.nn as nn

state_lock = threading.Lock()
STATE = {"step": 0, "loss": float("nan"), "history": []}


def report_status(signum, frame):
    with state_lock:
        print(f"[status] step={STATE['step']} loss={STATE['loss']:.4f}", flush=True)


def main():
    signal.signal(signal.SIGALRM, report_status)
    signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    t0 = time.time()
    for step in range(1_000_000):
        x = torch.randn(128, 256)
        y = x.mean(dim=1, keepdim=True)
        with state_lock:
            loss = (model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            STATE["grad_norm"] = gnorm.item()
            STATE["step"] = step
            STATE["loss"] = loss.item()
            STATE["history"].append(STATE["loss"])
            if len(STATE["history"]) > 100:
                STATE["history"] = STATE["history"][-100:]
            smoothed = sum(STATE["history"]) / len(STATE["history"])
            STATE["smoothed"] = smoothed
        if time.time() - t0 > 300:
            break
    signal.setitimer(signal.ITIMER_REAL, 0)


if __name__ == "__main__":
    main()
