"""Prefetches training shards with a small thread pool: each shard-loading task
decodes a shard of synthetic token data and then submits its checksum
verification to the same executor and waits for it before returning, while the
main loop trains a tiny MLP on the shards as they arrive. The defect: the
executor has max_workers=1, so load_shard occupies the only worker while it
blocks on verify_future.result() for a sub-task queued behind itself on the
same pool; the sub-task can never start (pool starvation) and training hangs
forever on the first shard.

Expected verdict: DEADLOCK
Run: nsadiag run --stall-timeout 8 -- python repro/heldout/prefetch_shards_threadpool.py
Cause words: load_shard | verify_future | ThreadPoolExecutor | max_workers=1
Next words: max_workers | separate pool | second executor | do not wait inside
"""
import hashlib
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn as nn

POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-io")


def verify_checksum(buf: bytes) -> str:
    return hashlib.sha256(buf).hexdigest()


def load_shard(idx: int):
    g = torch.Generator().manual_seed(idx)
    x = torch.randn(512, 64, generator=g)
    y = (x.sum(dim=1) > 0).long()
    verify_future = POOL.submit(verify_checksum, x.numpy().tobytes())
    digest = verify_future.result()
    return x, y, digest


def main():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    futures = [POOL.submit(load_shard, i) for i in range(8)]
    print(f"queued {len(futures)} shard loads", flush=True)
    for step, fut in enumerate(futures):
        x, y, digest = fut.result()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        print(f"shard {step} sha={digest[:8]} loss={loss.item():.4f}", flush=True)
    print("done")


if __name__ == "__main__":
    main()
