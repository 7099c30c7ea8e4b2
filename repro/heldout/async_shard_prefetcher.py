"""Trains a small MLP from batches produced by an asyncio-based shard
prefetcher: ShardPrefetcher.start() queues shard ids on an asyncio.Queue and
starts three _load_shard worker tasks, each of which first awaits the
self._ready asyncio.Event and then turns shard ids into (x, y) batches on the
self.batches queue; train() awaits prefetcher.batches.get() for every step.
The defect: self._ready is only set by mark_ready(), which is called inside
the warmup branch of train(), and WARMUP_STEPS is 0, so the event is never
set. All three workers wait on _ready.wait() forever, train() waits on
batches.get() forever, no task has a timeout and no timer is pending, so the
event loop idles in epoll and asyncio.run() never returns. The process uses
no CPU.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/async_shard_prefetcher.py
Cause words: _ready | asyncio.Event | mark_ready | batches.get | _load_shard
Next words: set the event | call mark_ready | asyncio.wait_for | timeout | remove the warmup gate
"""
import asyncio

import torch
import torch.nn as nn

WARMUP_STEPS = 0
N_SHARDS = 32


class ShardPrefetcher:
    def __init__(self, n_shards, n_workers=3):
        self.n_shards = n_shards
        self.n_workers = n_workers
        self.requests = asyncio.Queue()
        self.batches = asyncio.Queue(maxsize=8)
        self._ready = asyncio.Event()
        self._workers = []

    async def _load_shard(self, worker_id):
        await self._ready.wait()
        while True:
            shard_id = await self.requests.get()
            g = torch.Generator().manual_seed(shard_id)
            x = torch.randn(256, 16, generator=g)
            y = x.sum(dim=1, keepdim=True)
            await self.batches.put((x, y))
            self.requests.task_done()

    async def start(self):
        for shard_id in range(self.n_shards):
            self.requests.put_nowait(shard_id)
        self._workers = [asyncio.create_task(self._load_shard(i)) for i in range(self.n_workers)]
        print(f"prefetcher started with {self.n_workers} workers", flush=True)

    def mark_ready(self):
        self._ready.set()

    async def stop(self):
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)


async def train():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    prefetcher = ShardPrefetcher(N_SHARDS)
    await prefetcher.start()
    for step in range(N_SHARDS):
        if step < WARMUP_STEPS:
            prefetcher.mark_ready()
        x, y = await prefetcher.batches.get()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    await prefetcher.stop()


if __name__ == "__main__":
    asyncio.run(train())
