"""The rendezvous family (nsadiag.verdict.waits.rendezvous) and what it rests on: a thread
inside torch.distributed's setup is not in a collective (nsadiag.probes.frames), a rank
alone in init_process_group waits for ranks that never started, and across the ranks of a
job the rank that has not joined is followed (nsadiag.verdict.ranks)."""

from __future__ import annotations

import dataclasses

from nsadiag.evidence import StackSample, StallEvidence
from nsadiag.finding.next_step import chain_next
from nsadiag.probes.frames import collective_frame, find_collective
from nsadiag.probes.waits import ProcessWaits, ThreadWait
from nsadiag.verdict.chain import wait_chain
from nsadiag.verdict.ranks import RankEvidence, decide_ranks
from tests.nsadiag.verdict.test_ranks import job
from tests.nsadiag.verdict.test_wait_chain import evidence, frame, roundtrip, thread

TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/"


def _joining(tid: int = 100):
    return thread(tid, "MainThread",
                  frame("_create_c10d_store", 199, "return TCPStore(", TORCH + "rendezvous.py"),
                  frame("init_process_group", 1892, "store, rank, world_size = next(...)",
                        TORCH + "distributed_c10d.py"),
                  frame("main", 12, 'dist.init_process_group("gloo")'))


def test_a_thread_in_init_process_group_is_not_in_a_collective():
    joining = _joining()
    assert collective_frame(joining) is None
    assert find_collective([StackSample(1.0, 100, [joining])]) is None
    reduce = thread(100, "MainThread", frame("all_reduce", 2500, "work = group.allreduce(",
                                             TORCH + "distributed_c10d.py"),
                    frame("main", 30, "dist.all_reduce(t)"))
    assert collective_frame(reduce).function == "all_reduce"


def test_a_rank_alone_in_the_rendezvous_waits_for_ranks_that_never_started():
    waits = ProcessWaits(100, ("python", "train.py"),
                         threads=(ThreadWait(100, "hrtimer_nanosleep", 230, "clock_nanosleep"),))
    chain = roundtrip(wait_chain(evidence([_joining()], waits)))
    assert chain.end == "rendezvous-missing" and chain.subject == "init_process_group"
    assert chain.printed() == (
        "the main thread waits in torch.distributed's `init_process_group` at train.py:12 for "
        "every rank of the group to join -> no other process of the job was seen: the ranks "
        "it waits for never started under this command")
    said = chain_next(chain)
    assert said.startswith("Start every rank that `init_process_group` waits for at "
                           "train.py:12")
    assert "torchrun --nproc_per_node N" in said and "timeout=" in said


def _rank(r: int, main) -> RankEvidence:
    stall = StallEvidence(6.0, 2.0, 0.0, samples=[StackSample(1.0, 100 + r, [main])],
                          waits=ProcessWaits(100 + r, ("python", "train.py")))
    return RankEvidence(rank=r, pid=100 + r, events=[], event_counts={}, result=None,
                        stall=stall)


def test_across_ranks_the_rank_that_has_not_joined_is_followed():
    building = thread(101, "MainThread", frame("build_vocab", 30, "counts[w] += 1"),
                      frame("main", 10, "vocab = build_vocab(corpus)"))
    verdict = decide_ranks(job(), [_rank(0, _joining()), _rank(1, building)])
    assert verdict.name != "STALL-COLLECTIVE"
    chain = verdict.facts.stall.wait_chain
    assert chain is not None
    printed = chain.raw["printed"]
    assert printed.startswith("the main thread waits in torch.distributed's "
                              "`init_process_group` at train.py:12")
    assert "rank 1 (pid 101) has not joined it: " in printed and "train.py:30" in printed
    assert chain.raw["end"] == "rendezvous-late"
    # the ranks not in a rendezvous are decided as before: no sibling is read into them
    lone = decide_ranks(job(), [_rank(0, building), dataclasses.replace(
        _rank(1, building), pid=102)])
    assert "rendezvous" not in str(lone.facts.to_dict())
