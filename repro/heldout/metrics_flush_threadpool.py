"""Trains a small classifier and keeps running accuracy/loss totals in a
shared dict guarded by stats_lock, a threading.Lock. Every 10 steps the main
thread flushes the totals to an in-memory log on a ThreadPoolExecutor worker:
inside `with stats_lock:` it calls pool.submit(flush_metrics, ...) and then
waits for it with future.result() so that the totals can be reset
atomically. The defect: flush_metrics() itself does `with stats_lock:` to
take a consistent copy of the totals, so the worker blocks on the lock that
the main thread holds, and the main thread blocks in future.result() waiting
for the worker: a lock-order deadlock. Neither thread uses CPU.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/metrics_flush_threadpool.py
Cause words: stats_lock | flush_metrics | future.result | ThreadPoolExecutor | lock held while waiting
Next words: release stats_lock before future.result | copy the totals under the lock | do not wait while holding the lock | RLock will not help across threads | call flush_metrics without the lock
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn

stats_lock = threading.Lock()
totals = {"loss": 0.0, "correct": 0, "seen": 0}
metric_log = []


def flush_metrics(step):
    with stats_lock:
        seen = max(totals["seen"], 1)
        row = {"step": step, "loss": totals["loss"] / seen, "acc": totals["correct"] / seen}
    metric_log.append(row)
    print(f"[metrics] step {step} loss {row['loss']:.4f} acc {row['acc']:.3f}", flush=True)
    return row


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics")
    for step in range(1, 101):
        x = torch.randn(32, 20)
        y = torch.randint(0, 5, (32,))
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with stats_lock:
            totals["loss"] += loss.item() * len(y)
            totals["correct"] += (logits.argmax(1) == y).sum().item()
            totals["seen"] += len(y)
        if step % 10 == 0:
            with stats_lock:
                future = pool.submit(flush_metrics, step)
                future.result()
                totals.update(loss=0.0, correct=0, seen=0)
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    pool.shutdown()


if __name__ == "__main__":
    main()
