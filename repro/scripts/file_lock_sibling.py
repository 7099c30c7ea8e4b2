"""Defect: a sibling process holds the cache's file lock while it waits for the trainer.

A plain training script (no nsadiag import). A cache-warming process takes an exclusive
`fcntl.flock` on the cache file, then waits for the trainer to say the cache may be
written. The trainer first takes the same lock to read the cache: it waits for the lock,
and the warmer waits for the trainer.

Expected verdict: DEADLOCK; the wait chain: the main thread waits for the file lock on the
cache file, held by the warmer's pid (from /proc/locks), which waits on its own line:

    nsadiag run --stall-timeout 5 -- python repro/scripts/file_lock_sibling.py
"""

import fcntl
import multiprocessing as mp
import os
import tempfile

import torch
from torch import nn

CACHE = os.path.join(tempfile.gettempdir(), f"token-cache-{os.getpid()}.bin")


def warm_cache(path: str, claimed, may_write) -> None:
    with open(path, "ab") as cache:
        fcntl.flock(cache, fcntl.LOCK_EX)
        claimed.set()  # the cache is the warmer's: readers wait for its lock
        may_write.wait()  # the trainer sets it once it has read the cache
        cache.write(torch.randn(64).numpy().tobytes())
        fcntl.flock(cache, fcntl.LOCK_UN)


def main() -> None:
    claimed, may_write = mp.Event(), mp.Event()
    warmer = mp.Process(target=warm_cache, args=(CACHE, claimed, may_write),
                        name="cache-warmer")
    warmer.start()
    claimed.wait()
    with open(CACHE, "rb") as cache:
        fcntl.flock(cache, fcntl.LOCK_SH)  # waits for the warmer's lock
        cached = cache.read()
        fcntl.flock(cache, fcntl.LOCK_UN)
    may_write.set()
    warmer.join()
    model = nn.Linear(64, 1)
    print(f"{len(cached)} cached bytes, {sum(p.numel() for p in model.parameters())} weights")


if __name__ == "__main__":
    main()
