"""One decider per job, digests while it runs, ranks folded at a stall: simulated hosts
(threads, each with its own store client) against one real TCPStore, no processes."""

from __future__ import annotations

import threading
import time

import pytest

from nsadiag.evidence import (
    Evidence,
    ProcessOutcome,
    StackFrame,
    StackSample,
    StallEvidence,
    ThreadStack,
)
from nsadiag.harness.collectives import summarize
from nsadiag.hosts import shared as shared_module
from nsadiag.hosts.address import JobShape, StoreAddress
from nsadiag.hosts.decider import deciding_order, next_decider
from nsadiag.hosts.groups import FULL_CAPTURE_RANKS, JobGroup, RankGroup, fold, wanted
from nsadiag.hosts.link import HostEntry, HostLink
from nsadiag.hosts.merged import decide_hosts
from nsadiag.hosts.shared import SharedView
from nsadiag.probes import frames
from nsadiag.report.ranks import ranks_table
from nsadiag.verdict.ranks import RankEvidence
from nsadiag.verdictfacts import VerdictFacts

PER_HOST = 4
HOSTS = 6
CULPRIT = 13  # on host sim3, local rank 1


def _rank(r: int) -> RankEvidence:
    """Rank ``r`` of a HOSTS x PER_HOST job after one all_reduce: every rank waits in #2
    from train.py:57, the culprit polls at train.py:88 and never issued it."""
    host, local = divmod(r, PER_HOST)
    events = [{"t": 1000.0, "kind": "collective", "edge": "start", "n": 1, "op": "all_reduce",
               "origin": "ddp", "phase": "backward", "step": 0, "detail": "bucket 0",
               "shapes": [[4]]},
              {"t": 1000.1, "kind": "collective", "edge": "end", "n": 1, "op": "all_reduce",
               "status": "ok", "step": 0}]
    stuck = r == CULPRIT
    if not stuck:
        events.append({**events[0], "t": 1001.0, "n": 2, "step": 1})
    module = {"t": 1000.9, "kind": "module", "module": "blocks.0", "step": 1,
              "phase": "forward" if stuck else "backward", "edge": "enter"}
    line = StackFrame("poll", "/job/train.py", 88) if stuck else \
        StackFrame("main", "/job/train.py", 57)
    samples = [StackSample(1030.0 + i, 100 + r, [ThreadStack(1, "MainThread", [
        StackFrame("wait", "/venv/lib/python3.11/site-packages/torch/x.py", 9), line],
        active=False)]) for i in range(2)]
    return RankEvidence(rank=r, pid=100 + r, events=[module, *events], event_counts={},
                        result=None, started=[e for e in events if e["edge"] == "start"],
                        collectives=summarize(events),
                        stall=StallEvidence(30.0, 10.0, 0.0, samples=samples),
                        state=frames.classify(samples),
                        signature=frames.stack_signature(samples[-1]),
                        names={"host": f"sim{host}", "rank": r, "local_rank": local,
                               "node_rank": host})


def _job() -> Evidence:
    outcome = ProcessOutcome(exit_code=None, signal=9, killed_by_runner=True,
                             kill_reason="stall", wall_s=40.0, ended_at=1040.0)
    return Evidence(spec={"command": ["torchrun", "train.py"], "stall_timeout_s": 30.0,
                          "deadline_s": 600.0, "subject": "the command"},
                    events=[], event_counts={}, result=None, outcome=outcome, stall=None,
                    expected_events_per_step=None, total_steps=0, stall_timeout_s=30.0)


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _views(store) -> list[SharedView]:
    address = StoreAddress("127.0.0.1", store.port, "a test store")
    return [SharedView(JobShape(address, HOSTS), f"sim{i}",
                       HostLink(address, f"sim{i}", timeout_s=30), store_here=False)
            for i in range(HOSTS)]


def _own(i: int) -> list[RankEvidence]:
    return [_rank(i * PER_HOST + k) for k in range(PER_HOST)]


def _stall(views: list[SharedView], skip: set[int] = frozenset()) -> dict[int, object]:
    """Every host but ``skip`` ticks once, sim0 says a stall, each exchanges in a thread;
    each host's verdict over its own ranks and what it read."""
    for i, view in enumerate(views):
        view.tick(lambda i=i: _own(i))
    views[0].say_stall()
    verdicts: dict[int, object] = {}

    def host(i: int) -> None:
        view = views[i]
        assert view.stall_elsewhere()
        view.exchange(_own(i), 0.0)
        verdicts[i] = decide_hosts(_job(), _own(i) + view.remote_ranks(), view.view())

    threads = [threading.Thread(target=host, args=(i,)) for i in range(HOSTS)
               if i not in skip]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return verdicts


def test_the_deciding_order_is_the_stores_host_then_node_rank_then_joining():
    entries = [HostEntry("c", 2, False), HostEntry("a", None, False), HostEntry("b", 1, False),
               HostEntry("d", 7, True), HostEntry("b", 1, False)]
    assert deciding_order(entries) == ["d", "b", "c", "a"]
    assert deciding_order([HostEntry("x", None, False), HostEntry("y", None, False)]) == \
        ["x", "y"]
    assert next_decider(["d", "b", "c"], alive=["c", "b"], lost=["d"]) == "b"
    assert next_decider(["d", "b"], alive=["d"], lost=["d"]) is None
    assert HostEntry.parse("host7 3 1") == HostEntry("host7", 3, True)
    assert HostEntry.parse("host7 - 0") == HostEntry("host7", None, False)


def _groups(sizes: dict[str, list[list[int]]]) -> list[JobGroup]:
    return fold({h: [RankGroup(f"k{i}", "waiting", None, f"f{i}", ranks)
                     for i, ranks in enumerate(groups)] for h, groups in sizes.items()})


def test_a_small_job_sends_every_rank_a_large_one_its_suspects_and_representatives():
    small = _groups({"a": [[0, 1]], "b": [[2], [3]]})
    assert [g.count for g in small] == [3, 1]
    assert wanted(small) == {"a": [0, 1], "b": [2, 3]}
    ranks = list(range(FULL_CAPTURE_RANKS + 8))
    half = len(ranks) // 2
    large = _groups({"a": [ranks[:half]], "b": [ranks[half:-1], [ranks[-1]]]})
    # the largest group (k0 on both hosts) is represented by its lowest rank, the odd
    # rank on b is a suspect, and represents its own group
    assert [(g.key, g.count) for g in large] == [("k0", len(ranks) - 1), ("k1", 1)]
    assert wanted(large) == {"a": [0], "b": [ranks[-1]]}


def test_the_decider_folds_the_job_and_every_host_names_the_culprit_from_what_it_read(store):
    views = _views(store)
    verdicts = _stall(views)
    assert sorted(verdicts) == list(range(HOSTS))
    culprit = f"rank {CULPRIT} on sim3 (local rank 1, node 3)"
    for i, verdict in verdicts.items():
        assert verdict.name == "STALL-COLLECTIVE", verdict.reasons
        assert verdict.reasons[0].startswith(f"culprit: {culprit} never issued collective #2")
        # the ranks of each host's own and of the folded group, one sentence for the group
        assert f"{HOSTS * PER_HOST - 1} ranks (rank 0 on sim0 (local rank 0, node 0) and " \
            f"{HOSTS * PER_HOST - 2} more on {HOSTS} host(s)) wait in all_reduce #2 " \
            f"(bucket 0) at main (train.py:57) for {culprit}" in verdict.reasons[0]
        assert any(r.startswith(f"{HOSTS * PER_HOST} ranks on {HOSTS} hosts stood in 2 "
                                f"place(s) at the stall (23 at main (train.py:57) in "
                                "all_reduce #2 (bucket 0); 1 at poll (train.py:88))")
                   for r in verdict.reasons), verdict.reasons
        facts = VerdictFacts.from_dict(verdict.facts.to_dict())
        assert facts.ranks.world_size == HOSTS * PER_HOST
        assert [(c["rank"], c["host"]) for c in verdict.facts.to_dict()["culprit_ranks"]] == \
            [(CULPRIT, "sim3")]
        rows = facts.ranks.ranks
        folded = [row for row in rows if row.folded]
        own = [row.rank for row in rows if not row.folded]
        assert own == sorted({*range(i * PER_HOST, (i + 1) * PER_HOST), 0, CULPRIT})
        assert sum(int(row.folded.split()[0]) for row in folded) + len(own) == \
            HOSTS * PER_HOST
        table = "\n".join(ranks_table(rows))
        assert "ranks (" in table and "as rank 0" in table
        assert views[i].view().decider == "sim0"
    # what crossed the store: a host other than the decider read the request, the merged
    # evidence (the groups, two ranks' captures) and nothing of the other hosts' digests
    other = views[4]
    assert "sim1" not in other.states or other.states["sim1"].ranks == []
    assert {r.rank for r in other.remote_ranks()} == {0, CULPRIT}
    assert other.link is not None and other.link.read_bytes < 30_000


def test_a_decider_lost_at_the_stall_is_replaced_and_named(store, monkeypatch):
    monkeypatch.setattr(shared_module, "HOSTS_CAPTURE_MARGIN_S", 1.0)
    monkeypatch.setattr(shared_module, "HOSTS_DECIDER_MARGIN_S", 1.0)
    views = _views(store)
    started = time.monotonic()
    verdicts = _stall(views, skip={0})
    assert sorted(verdicts) == list(range(1, HOSTS)) and time.monotonic() - started < 60
    for i, verdict in verdicts.items():
        view = views[i].view()
        assert (view.decider, view.replaced, view.lost) == ("sim1", ["sim0"], ["sim0"])
        assert any("host(s) sim0, first in the deciding order, never asked for the captures "
                   "at the stall: lost; host sim1 decided in its place" in r
                   for r in verdict.reasons), verdict.reasons
        # sim0's ranks are read from its last digest: where they were last seen
        assert verdict.name == "STALL-COLLECTIVE", verdict.reasons
        assert any(r.startswith("host sim0 lost at ") and "its ranks 0, 1, 2, 3 last seen at"
                   in r for r in verdict.reasons), verdict.reasons
        assert f"rank {CULPRIT} on sim3" in " ".join(verdict.reasons)


def test_while_the_job_runs_a_host_costs_the_store_under_two_operations_a_second(store):
    address = StoreAddress("127.0.0.1", store.port, "a test store")
    now = [2000.0]
    views = [SharedView(JobShape(address, 3), f"sim{i}", HostLink(address, f"sim{i}"),
                        clock=lambda: now[0], store_here=i == 0) for i in range(3)]
    for i, view in enumerate(views):
        view.tick(lambda i=i: _own(i))
    before = [v.link.ops for v in views]
    seconds = 60.0
    for _ in range(int(seconds / 0.2)):  # the watch's poll: a stall look and a tick
        now[0] += 0.2
        for i, view in enumerate(views):
            assert not view.stall_elsewhere()
            view.tick(lambda i=i: _own(i))
    per_s = [(v.link.ops - b) / seconds for v, b in zip(views, before, strict=True)]
    assert views[0].deciding() and max(per_s[1:]) < 2.0 and per_s[0] < 2.2, per_s
    # the decider read every digest; the others only the decider's finding
    assert set(views[0].states) == {"sim0", "sim1", "sim2"}
    assert set(views[1].states) == {"sim1"} and views[1].finding_read


def test_a_groups_members_cross_the_store_as_spans():
    from nsadiag.hosts.groups import spans, unspan

    assert spans([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    assert unspan("0-3,7,9-10") == [0, 1, 2, 3, 7, 9, 10]
    assert unspan([4, 5]) == [4, 5] and spans([]) == "" and unspan("") == []
    group = JobGroup("k", "waiting", "all_reduce #2 (bucket 0)", "main (train.py:57)",
                     {"sim0": list(range(8)), "sim1": [8, 10]})
    assert group.to_dict()["members"] == {"sim0": "0-7", "sim1": "8,10"}
    assert JobGroup.from_dict(group.to_dict()) == group
