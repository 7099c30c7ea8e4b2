"""nsa.ddp: ranks leave the process group together, counted in the store."""

from __future__ import annotations

import threading

import pytest
import torch.distributed as dist

from nsa import ddp
from tests.procs import wait_for


class _Store:
    """The add() of a c10d store: a counter per key, thread-safe."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + amount
            return self.counts[key]


@pytest.fixture
def store(monkeypatch):
    fake = _Store()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: fake)
    return fake


def test_a_rank_waits_until_its_peer_has_left_the_barrier(store):
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (ddp.leave_together(2, timeout_s=60.0),
                                              done.set()))
    waiter.start()
    wait_for(lambda: store.counts, 60, "the waiting rank to count itself")
    (key,) = store.counts
    assert not done.wait(0.3), "returned before the peer left the barrier"
    store.add(key, 1)  # the peer leaves
    waiter.join(timeout=30)
    assert done.is_set() and store.counts[key] == 2


def test_each_teardown_counts_under_its_own_key(store):
    store.add("nsa/leaving-elsewhere", 5)
    for _ in range(2):
        ddp.leave_together(1, timeout_s=5.0)
    assert sorted(v for k, v in store.counts.items() if k != "nsa/leaving-elsewhere") \
        == [1, 1]


def test_a_peer_that_never_comes_or_a_missing_store_ends_the_wait(store, monkeypatch):
    ddp.leave_together(2, timeout_s=0.2)  # returns: the peer is gone
    assert list(store.counts.values()) == [1]

    def gone():
        raise RuntimeError("store unreachable")

    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", gone)
    ddp.leave_together(2, timeout_s=60.0)  # returns at once instead of raising
