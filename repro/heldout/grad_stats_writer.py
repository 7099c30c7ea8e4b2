"""Trains a small two-layer regressor and streams per-step statistics (loss,
per-parameter gradient norms, learning rate) to a background summary thread
through a bounded queue.Queue(maxsize=4), so that the summary work does not
slow down the loop. summarize_stats() builds its column table from the keys
of the first record it sees. The defect: when warmup ends at step 10 the
training loop starts adding an extra "lr_scale" key, so the summary thread
raises KeyError on that record and dies (its traceback is printed, but the
process keeps running). Nothing drains stats_queue any more; after four more
steps the queue is full and the main training loop blocks forever in
stats_queue.put() (no timeout, no check that the consumer is alive). The
process sleeps without using CPU.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/grad_stats_writer.py
Cause words: stats_queue.put | summarize_stats | KeyError | lr_scale | queue full
Next words: put with timeout | check the consumer thread is alive | handle the exception in summarize_stats | setdefault | unbounded queue
"""
import queue
import threading

import torch
import torch.nn as nn

WARMUP_STEPS = 10


def summarize_stats(stats_queue, summary):
    columns = None
    while True:
        record = stats_queue.get()
        if record is None:
            break
        if columns is None:
            columns = {k: [] for k in record}
        for key, value in record.items():
            columns[key].append(float(value))
        n = len(columns["loss"])
        if n % 5 == 0:
            print(f"[summary] {n} records, mean loss {sum(columns['loss'][-5:]) / 5:.4f}", flush=True)
    summary.update(columns)


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    stats_queue = queue.Queue(maxsize=4)
    summary = {}
    writer = threading.Thread(target=summarize_stats, args=(stats_queue, summary), name="stats-writer")
    writer.start()

    w_true = torch.randn(32, 1)
    for step in range(200):
        x = torch.randn(128, 32)
        y = x @ w_true + 0.1 * torch.randn(128, 1)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        record = {"loss": loss.item(), "lr": opt.param_groups[0]["lr"]}
        for name, p in model.named_parameters():
            record[f"grad_norm/{name}"] = p.grad.norm().item()
        if step >= WARMUP_STEPS:
            record["lr_scale"] = 0.5
            opt.param_groups[0]["lr"] = 0.025
        opt.step()
        stats_queue.put(record)
        print(f"step {step} loss {loss.item():.4f}", flush=True)

    stats_queue.put(None)
    writer.join()
    print(f"summary has {len(summary)} columns")


if __name__ == "__main__":
    main()
