"""Every claim of a stuck run's Next line against the chain it was built from
(nsadiag.finding.next_step, nsadiag.finding.trial.next_action): a lock sentence only where
a lock is in the chain, end of file only for a pipe, a timeout for a polling loop, never
per-token advice, and every name it quotes is one the chain printed."""

from __future__ import annotations

import re

import pytest

from nsadiag.finding.next_step import chain_next
from nsadiag.finding.trial import next_action
from nsadiag.verdict.chain import ENDS, Hop, WaitChain

LOCK_WORDS = re.compile(r"\blocks?\b|RLock|`with`", re.IGNORECASE)
FIX_CODE = {"proc.stdin.close()", "communicate()", "subprocess.run(input=...)",
            "put(timeout=...)", "get(timeout=...)", "wait(timeout=...)", "finally", "with",
            "try", "threading.RLock", "multiprocessing_context=\"spawn\"", "worker_init_fn",
            "LOCK_NB", "timeout", "num_workers=0", "put", "DistributedSampler",
            "drop_last=True", "join", "settimeout(...)", "timeout="}

CHAINS = [
    WaitChain((Hop("lock", "the main thread waits for `a` at t.py:5", "t.py:5"),
               Hop("holder", "`a` is held by thread w (inside `with a:` at t.py:9)", "t.py:9"),
               Hop("lock", "thread w waits for `b` at t.py:10, which the main thread holds "
                           "(inside `with b:` at t.py:4): each waits for the other",
                   "t.py:10")), "lock-cycle", "a` and `b"),
    WaitChain((Hop("lock", "the main thread waits for `a` at t.py:5", "t.py:5"),
               Hop("holder", "`a` is held by the same thread, in run (inside `with a:` at "
                             "t.py:2): a lock that is not reentrant, taken twice", "t.py:2")),
              "lock-self", "a"),
    WaitChain((Hop("lock", "the main thread waits for `a` at t.py:5", "t.py:5"),
               Hop("holder", "`a` is held by thread w (inside `with a:` at t.py:9)", "t.py:9"),
               Hop("frame", "thread w runs t.py:12 `crunch()`", "t.py:12")), "lock-held", "a"),
    WaitChain((Hop("lock", "the main thread waits for `a` at t.py:5", "t.py:5"),
               Hop("holder", "no live thread is inside a `with a:` block")), "lock-lost", "a"),
    WaitChain((Hop("worker", "the main thread waits for a batch from the DataLoader at "
                             "t.py:3", "t.py:3"),
               Hop("lock", "DataLoader worker 0 (pid 9) waits for `self.lock` at t.py:40",
                   "t.py:40"),
               Hop("holder", "`self.lock` is held by no thread of DataLoader worker 0: it was "
                             "locked when the process was forked")), "lock-lost-fork",
              "self.lock"),
    WaitChain((Hop("lock", "the main thread waits for `s` at t.py:43", "t.py:43"),
               Hop("holder", "`s` is held by thread loader (inside `with s:` at t.py:30)",
                   "t.py:30"),
               Hop("queue", "thread loader waits in `q.put` at t.py:31 (the queue is full)",
                   "t.py:31")), "queue-full", "s"),
    WaitChain((Hop("queue", "the main thread waits for an item from `batches` at t.py:47",
                   "t.py:47"),
               Hop("producer", "thread producer died of ValueError: x at parse (t.py:30)")),
              "producer-died", "batches"),
    WaitChain((Hop("queue", "the main thread waits for an item from `batches` at t.py:47",
                   "t.py:47"),
               Hop("producer", "no other thread of the process is alive to feed it")),
              "no-producer", "batches"),
    WaitChain((Hop("child", "the main thread waits for child pid 3 (`sort -u`) to exit at "
                            "t.py:27", "t.py:27"),
               Hop("pipe", "pid 3 is blocked reading fd 0 (its stdin), pipe:[7], a pipe whose "
                           "write end this process holds (fd 10)")), "pipe-eof", "sort -u"),
    WaitChain((Hop("child", "the main thread waits for child pid 3 (`tool`) to exit at "
                            "t.py:27", "t.py:27"),
               Hop("process", "pid 3 waits in the kernel at hrtimer_nanosleep")),
              "child-waits", "tool"),
    WaitChain((Hop("file-lock", "the main thread waits for the flock lock on /tmp/c at t.py:40",
                   "t.py:40"),
               Hop("holder", "it is held (write) by pid 8, by /proc/locks"),
               Hop("frame", "pid 8: the main thread waits at w.py:28 `ev.wait()`", "w.py:28")),
              "file-lock", "/tmp/c"),
    WaitChain((Hop("worker", "the main thread waits for a batch from the DataLoader at t.py:3",
                   "t.py:3"),
               Hop("worker", "DataLoader worker 0 (pid 9) runs t.py:50 `read()`", "t.py:50")),
              "worker"),
    WaitChain((Hop("poll", "the main thread polls `not os.path.exists(m)` in a sleep loop at "
                           "t.py:23, still looping at the stall", "t.py:23"),),
              "poll", "not os.path.exists(m)"),
    WaitChain((Hop("socket", "the main thread waits to read fd 5, a TCP connection from "
                             "127.0.0.1:40100 to 127.0.0.1:8123 at t.py:14", "t.py:14"),
               Hop("peer", "the other end (127.0.0.1:8123) is held by pid 7 (`python "
                           "server.py`)"),
               Hop("frame", "pid 7: the main thread waits at server.py:30 `done.wait()`",
                   "server.py:30")), "socket-peer", "python server.py"),
    WaitChain((Hop("socket", "the main thread waits to read fd 5, a TCP connection from "
                             "10.0.0.2:40100 to 10.0.0.9:6379 at t.py:14", "t.py:14"),
               Hop("peer", "the other end, 10.0.0.9:6379, is on another machine: what it "
                           "does is not visible from here")), "socket-remote",
              "10.0.0.9:6379"),
    WaitChain((Hop("collective", "rank 0 waits in all_reduce #5 (DDP bucket 0, 4 tensors), the "
                                 "gradients of step 4 at t.py:44 (rank 0: 4 steps done)",
                   "t.py:44"),
               Hop("collective", "rank 1 never began step 4: it ran 4 steps and waits in "
                                 "barrier #5 at t.py:49")),
              "uneven-steps", "rank 0 began 5, rank 1 ran 4"),
    WaitChain((Hop("collective", "rank 1 waits in all_reduce #3 (4 bytes) at t.py:20"),
               Hop("collective", "rank 0 waits in all_reduce #3 (DDP bucket 0) at t.py:30")),
              "collective-differs", "all_reduce #3 (4 bytes)"),
    WaitChain((Hop("frame", "the main thread waits at t.py:12 `f.result()`", "t.py:12"),
               Hop("unknown", "what would release it is not named by the evidence")),
              "unknown"),
]


def test_the_table_covers_every_way_a_chain_ends():
    assert {chain.end for chain in CHAINS} == set(ENDS)


@pytest.mark.parametrize("chain", CHAINS, ids=lambda chain: chain.end)
def test_each_next_claim_follows_from_its_chain(chain):
    said = chain_next(chain)
    if chain.end == "unknown":
        assert said is None  # no cause is named where the chain names none
        said = next_action("DEADLOCK", {"wait_chain": chain.to_dict()}, None)
    if chain.end == "collective-differs":
        assert said is None  # the collective verdict's own sentence: an extra collective
        said = next_action("STALL-COLLECTIVE", {"wait_chain": chain.to_dict()}, None)
    if chain.end == "uneven-steps":
        assert "same number of steps" in said and chain.subject in said
        assert "some ranks only" not in said
    assert bool(LOCK_WORDS.search(said)) == (chain.has("lock") or chain.has("file-lock")), said
    assert ("end of file" in said) == chain.has("pipe"), said
    assert "timeout" in said or "deadline" in said or chain.end.startswith("lock") or \
        chain.end in ("pipe-eof", "uneven-steps", "collective-differs"), said
    if chain.end == "poll":
        assert "timeout" in said and chain.subject in said
    if chain.end == "lock-lost-fork":
        assert "fork" in said
    assert "per-token" not in said and "tensor ops" not in said
    printed = chain.printed()
    for quoted in re.findall(r"`([^`]+)`", said):
        assert quoted in printed or quoted in FIX_CODE, (quoted, said)
    for where in re.findall(r"\b[\w.]+\.py:\d+", said):
        assert where in printed, (where, said)


def test_a_deadlock_without_a_chain_names_no_lock_and_no_cause():
    said = next_action("DEADLOCK", {}, None)
    assert not LOCK_WORDS.search(said) and "never released" not in said
