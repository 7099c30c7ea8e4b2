"""Async training driver: an asyncio event loop runs the training coroutine and
a metrics-flushing coroutine. The helper log_metrics() is meant to be callable
from anywhere, so it schedules the flush with
asyncio.run_coroutine_threadsafe(flush_metrics(...), loop) and blocks on
.result(). The defect: log_metrics() is called from train_epoch(), which runs on
the event loop's own thread, so .result() blocks the loop thread while the
scheduled coroutine can only run on that same loop; it never runs and the
program hangs forever after the first logging step.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/async_metrics_logger.py
Cause words: run_coroutine_threadsafe | log_metrics | .result()
Next words: await | create_task | call from another thread | ensure_future
"""
import asyncio

import torch
import torch.nn as nn

LOOP = None
HISTORY = []


async def flush_metrics(step, loss):
    await asyncio.sleep(0)
    HISTORY.append((step, loss))
    print(f"[metrics] step={step} loss={loss:.4f}", flush=True)


def log_metrics(step, loss):
    fut = asyncio.run_coroutine_threadsafe(flush_metrics(step, loss), LOOP)
    return fut.result()


async def train_epoch(model, opt, steps=200):
    loss_fn = nn.MSELoss()
    for step in range(steps):
        x = torch.randn(64, 32)
        y = x.sum(dim=1, keepdim=True)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step}", flush=True)
            log_metrics(step, loss.item())
        await asyncio.sleep(0)


async def main():
    global LOOP
    LOOP = asyncio.get_running_loop()
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    await train_epoch(model, opt)
    print("finished", len(HISTORY))


if __name__ == "__main__":
    asyncio.run(main())
