"""Stragglers across hosts: a rank's steps read from its heartbeat events (time outside
and inside collectives), the decision over every rank's published paces (one rank slower
at each of the latest steps; never everyone slow alike, never a one-off, never a few
milliseconds), and two hosts' views through a real TCPStore: each names the slow rank of
the other host with its figures, in its view, its report section and the merged verdict."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from nsadiag.evidence import Evidence
from nsadiag.finding.run import run_finding
from nsadiag.hosts.address import JobShape, StoreAddress
from nsadiag.hosts.link import HostLink
from nsadiag.hosts.merged import decide_hosts
from nsadiag.hosts.shared import SharedView
from nsadiag.report.straggler import straggler_section
from nsadiag.report.top import top_block
from nsadiag.rundir import TrialRecord
from nsadiag.verdict import Verdict
from nsadiag.verdict.ranks import RankEvidence
from nsadiag.verdict.straggler import (
    StepPace,
    Straggler,
    find_straggler,
    hot_frame,
    step_paces,
)
from nsadiag.verdict.thresholds import (
    STRAGGLER_KEEP_GAP_S,
    STRAGGLER_KEEP_RATIO,
    STRAGGLER_MIN_GAP_S,
    STRAGGLER_RATIO,
    STRAGGLER_STEPS,
)
from tests.helpers import TESTS, nsadiag
from tests.twohosts import free_port, kill_host, make_hosts, start_host, torchrun, unshare_refused

T0 = 1_700_000_000.0
SLACK = 0.002  # from the all_reduce's completion to the optimizer step's end


def near(value: float):
    """Equal to ``value`` within the resolution of a unix time (about 0.2 us)."""
    return pytest.approx(value, abs=1e-5)


def job_events(owns: dict[int, list[float]]) -> dict[int, list[dict]]:
    """Every rank's events of a synchronous job: at step k rank r computes for owns[r][k]
    seconds (60 % of it before its backward), then issues its gradient all_reduce, which
    completes when the slowest rank has issued it; the step ends SLACK later."""
    steps = len(next(iter(owns.values())))
    events: dict[int, list[dict]] = {r: [{"t": T0 - 1.0, "kind": "start"}] for r in owns}
    begin = T0
    for k in range(steps):
        period = max(owns[r][k] for r in owns)
        step_s = period + SLACK
        for r, own in owns.items():
            events[r] += [
                {"t": begin + own[k], "kind": "collective", "edge": "start", "n": k + 1},
                {"t": begin + period, "kind": "collective", "edge": "end", "n": k + 1},
                {"t": begin + step_s, "kind": "step", "step": k, "step_s": step_s,
                 "forward_s": 0.6 * own[k], "backward_s": step_s - 0.6 * own[k]}]
        begin += step_s
    return events


def names(rank: int, per_host: int = 2) -> dict:
    node = rank // per_host
    return {"host": f"host{node + 1}", "rank": rank, "local_rank": rank % per_host,
            "node_rank": node}


def label(rank: int) -> str:
    n = names(rank)
    return f"rank {rank} on {n['host']} (local rank {n['local_rank']}, node {n['node_rank']})"


def decide(owns: dict[int, list[float]]):
    events = job_events(owns)
    return find_straggler({r: step_paces(e) for r, e in events.items()},
                          {r: names(r) for r in owns}, {r: label(r) for r in owns})


# ---- a rank's steps from its events ---------------------------------------------------------


def test_a_steps_own_time_is_its_time_outside_its_collectives():
    paces = step_paces(job_events({0: [0.05, 0.04], 1: [0.30, 0.25]})[0])
    assert [p.step for p in paces] == [0, 1]
    # rank 0 computed 0.05 s, then waited in all_reduce until rank 1 issued it at 0.30 s
    assert paces[0].step_s == near(0.302)
    assert paces[0].waited_s == near(0.25)
    assert paces[0].own_s == near(0.052)
    assert paces[1].own_s == near(0.042)
    # overlapping collectives count once; one outside the step not at all
    events = [{"t": 10.0, "kind": "start"},
              {"t": 10.1, "kind": "collective", "edge": "start", "n": 1},
              {"t": 10.2, "kind": "collective", "edge": "start", "n": 2},
              {"t": 10.5, "kind": "collective", "edge": "end", "n": 1},
              {"t": 10.6, "kind": "collective", "edge": "end", "n": 2},
              {"t": 11.0, "kind": "step", "step": 3, "step_s": 1.0},
              {"t": 11.1, "kind": "collective", "edge": "start", "n": 3},
              {"t": 11.2, "kind": "collective", "edge": "end", "n": 3}]
    (pace,) = step_paces(events)
    assert (pace.step, pace.waited_s, pace.own_s) == (3, near(0.5), near(0.5))
    assert StepPace.from_list(pace.to_list()) == pace


def test_a_step_that_began_before_the_first_event_kept_is_left_out():
    events = job_events({0: [0.1, 0.1, 0.1], 1: [0.1, 0.1, 0.1]})[0]
    # from step 0's end on: step 1 began there, step 0 before
    assert [p.step for p in step_paces([e for e in events if e["t"] >= events[3]["t"]])] \
        == [1, 2]
    # from step 1's first collective on: step 1 began before it
    assert [p.step for p in step_paces([e for e in events if e["t"] > events[3]["t"]])] \
        == [2]


def test_the_hot_frame_is_the_one_most_seen_in_the_latest_pulses():
    pulses = [{"frame": "main (train.py:9)"}] * 20 + [{"frame": None}] * 3 + \
        [{"frame": "load (data.py:4)"}] * 6 + [{"frame": "main (train.py:9)"}] * 4
    assert hot_frame(pulses) == {"frame": "load (data.py:4)", "seen": 6, "of": 10}
    assert hot_frame([{"frame": None}, {}]) is None


# ---- the decision ---------------------------------------------------------------------------


def test_one_rank_slower_at_every_step_is_named_with_its_figures():
    owns = {r: [0.02] * (1 + STRAGGLER_STEPS) for r in (0, 1, 2)}
    owns[3] = [0.32, 0.30, 0.34, 0.32, 0.31, 0.33]
    assert len(owns[3]) == 1 + STRAGGLER_STEPS
    found = decide(owns)
    assert found is not None
    assert (found.rank, found.host, found.local_rank) == (3, "host2", 1)
    assert found.steps == (1, 2, 3, 4, 5)
    # its own time and the others' hold the SLACK after the all_reduce too
    assert (found.own_s, found.least_s) == (near(0.322), near(0.302))
    assert found.others_own_s == near(0.022)
    assert found.ratio == pytest.approx(0.322 / 0.022, rel=1e-3)
    assert found.step_s == near(0.322)
    assert found.others_waited_s == near(0.30)
    assert found.forward_s == near(0.192)
    sentence = found.sentence()
    assert sentence.startswith(
        "straggler: rank 3 on host2 (local rank 1, node 1) takes 0.322 s per step outside "
        "collectives (at least 0.302 s at each of its steps 1-5) against a median of 0.022 s "
        "for the other 3 rank(s) (14.6x); the others wait a median 0.300 s per step in "
        "collectives. Where its 0.322 s steps go (host2's figures): 0.192 s before its "
        "backward (loading the batch and forward), 0.130 s in backward"), sentence


def test_two_slow_ranks_are_not_one_straggler():
    owns = {r: [0.02] * (1 + STRAGGLER_STEPS) for r in range(4)}
    owns[2] = owns[3] = [0.3] * (1 + STRAGGLER_STEPS)
    assert decide(owns) is None


def test_a_rank_a_few_milliseconds_over_a_tiny_median_is_no_second_straggler():
    # a tiny model: the even ranks spend 1-6 ms per step outside collectives, so one of them
    # is 2.5x the others' median by a few milliseconds while rank 3 sleeps 0.3 s per step
    owns = {0: [0.001] * (1 + STRAGGLER_STEPS), 1: [0.005] * (1 + STRAGGLER_STEPS),
            2: [0.001] * (1 + STRAGGLER_STEPS), 3: [0.3] * (1 + STRAGGLER_STEPS)}
    found = decide(owns)
    assert found is not None and found.rank == 3


def test_the_ranks_latest_steps_need_not_be_the_same_steps():
    paces = {r: step_paces(e) for r, e in
             job_events({r: [0.02] * 12 if r != 1 else [0.4] * 12 for r in range(4)}).items()}
    paces[2] = paces[2][:8]  # host2's ranks as read some steps ago
    paces[3] = paces[3][:8]
    found = find_straggler(paces, {r: names(r) for r in paces}, {r: label(r) for r in paces})
    assert (found.rank, found.host, found.steps) == (1, "host1", (7, 8, 9, 10, 11))


def test_even_ranks_with_noise_have_no_straggler():
    noise = random.Random(7)
    steps = 30
    # every rank's own time wanders by up to +-40 % around 0.1 s, each step independently
    owns = {r: [0.1 * noise.uniform(0.6, 1.4) for _ in range(steps)] for r in range(4)}
    assert decide(owns) is None
    # the same noise on a rank that takes five times as long stands out (its fastest step
    # is still more than twice the slowest of the others)
    owns[2] = [5 * own for own in owns[2]]
    assert decide(owns).rank == 2


def test_everyone_slow_alike_is_no_straggler():
    steps = 1 + STRAGGLER_STEPS
    assert decide({r: [2.0] * steps for r in range(4)}) is None


def test_a_one_off_slow_step_or_a_short_run_is_no_straggler():
    steps = 1 + STRAGGLER_STEPS
    owns = {r: [0.02] * steps for r in range(4)}
    owns[2][3] = 0.5  # one slow step inside the window
    assert decide(owns) is None
    owns = {r: [0.02] * STRAGGLER_STEPS for r in range(4)}  # step 0 does not count
    owns[1] = [0.5] * STRAGGLER_STEPS
    assert decide(owns) is None


def test_the_slow_rank_must_be_the_same_at_every_step():
    steps = 1 + STRAGGLER_STEPS
    owns = {r: [0.02] * steps for r in range(4)}
    for k in range(steps):
        owns[k % 2][k] = 0.4  # ranks 0 and 1 take turns being slow
    assert decide(owns) is None


def test_a_few_milliseconds_more_are_no_straggler_whatever_the_ratio():
    steps = 1 + STRAGGLER_STEPS
    owns = {r: [0.005] * steps for r in range(4)}
    owns[3] = [0.005 + STRAGGLER_MIN_GAP_S * 0.8] * steps  # 9x, but 40 ms
    assert decide(owns) is None
    owns[3] = [0.005 + STRAGGLER_MIN_GAP_S * 1.2] * steps
    assert decide(owns).rank == 3


# ---- two hosts through a store --------------------------------------------------------------


class Clock:
    """A clock the test moves: every tick of a view publishes."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _rank(rank: int, events: list[dict]) -> RankEvidence:
    return RankEvidence(rank=rank, pid=100 + rank, events=list(events), event_counts={},
                        result=None, names=names(rank))


def test_each_host_names_the_other_hosts_slow_rank_and_the_merged_verdict_says_it(store):
    steps = 12
    owns = {r: [0.03] * steps for r in range(4)}
    owns[3] = [0.43] * steps
    events = job_events(owns)
    address = StoreAddress("127.0.0.1", store.port, "a test store")
    clock = Clock()
    views = [SharedView(JobShape(address, 2), f"host{i + 1}",
                        HostLink(address, f"host{i + 1}", timeout_s=30), clock=clock)
             for i in range(2)]
    heard: list = []
    views[0].on_straggler = heard.append
    for view in views:  # their first publications: no steps yet
        view.tick(lambda: [])
    assert views[0].view().straggler is None
    clock.now += 10.0
    sleeping = {3: {"frame": "main (train.py:31)", "seen": 9, "of": 10}}
    for i, view in enumerate(views):
        view.tick(lambda i=i: [_rank(r, events[r]) for r in (2 * i, 2 * i + 1)],
                  lambda i=i: sleeping if i == 1 else {})
    views[0].tick(lambda: [_rank(r, events[r]) for r in (0, 1)])  # not yet due: no-op
    assert heard == [] and views[1].view().straggler is None
    clock.now += 10.0
    # host1 decides (node 0): it reads host2's digest; host2 reads host1's finding
    assert views[0].deciding() and not views[1].deciding()
    for i, view in enumerate(views):
        view.tick(lambda i=i: [_rank(r, events[r]) for r in (2 * i, 2 * i + 1)],
                  lambda i=i: sleeping if i == 1 else {})
    seen = [view.view().straggler for view in views]
    for found in seen:
        assert found is not None
        assert (found["rank"], found["host"], found["local_rank"]) == (3, "host2", 1)
        assert found["steps"] == list(range(steps - STRAGGLER_STEPS, steps))
        assert found["own_s"] == near(0.432)
        assert found["others_own_s"] == near(0.032)
        assert found["sentence"].endswith("; its sampler saw it at main (train.py:31) in 9 of "
                                          "its last 10 pulses")
    assert seen[0]["seen_at"] == seen[1]["seen_at"] == T0 + 20.0  # the decider's read
    assert [view.named for view in views] == [3, 3]
    # host1's status line heard rank 3 at the read that found it
    assert [h["rank"] for h in heard] == [3]
    # host2 read host1's finding, never host1's digest
    assert "host1" not in views[1].states
    # each host's report section, and the verdict decided over both hosts' ranks
    lines = straggler_section(views[0].view().to_dict().get("straggler"))
    assert lines[0].startswith("straggler: rank 3 on host2 (local rank 1, node 1) takes "
                               "0.432 s per step outside collectives")
    assert lines[0].endswith("UTC, from the step times every host published in the job's "
                             "store).")
    assert lines[-1].startswith("| 3 | host2 | 1 | 7-11 | 0.432 | 0.032 | 13.5 |")
    ranks = [_rank(r, events[r]) for r in range(4)]
    job = Evidence.from_dict({"spec": {}, "events": [], "event_counts": {}, "result": None,
                              "outcome": {"exit_code": 0, "signal": None,
                                          "killed_by_runner": False, "wall_s": 5.0}})
    verdict = decide_hosts(job, ranks, views[1].view())
    assert verdict.reasons[-1] == seen[1]["sentence"]
    assert verdict.facts.ranks.straggler.rank == 3
    # host2's end, published without frames, keeps where its ranks were last seen
    views[1].settle([_rank(r, events[r]) for r in (2, 3)], ended_ok=True)
    assert views[1].states["host2"].frames == sleeping


# ---- nsadiag merge ------------------------------------------------------------------------------


def _ended_run(root, host: str, ranks: list[RankEvidence], frames: dict) -> object:
    """The run directory of ``host`` after the job ended well: its own ranks with their
    steps, and the hot frames its sampler saw (``frames``, this host's ranks')."""
    from nsadiag.hosts.merged import HostState, HostsView
    from nsadiag.rundir import write_json

    run = root / host
    run.mkdir()
    state = HostState(host, "ended", T0 + 30, ranks, {}, frames)
    view = HostsView(host, "shared through the test's store", True, {host: state})
    job = Evidence.from_dict({"spec": {"command": ["torchrun", "train.py"]}, "events": [],
                              "event_counts": {}, "result": None,
                              "outcome": {"exit_code": 0, "signal": None,
                                          "killed_by_runner": False, "wall_s": 30.0}})
    evidence = dataclasses.replace(job, ranks=[r.to_dict() for r in ranks],
                                   hosts=view.to_dict())
    record = TrialRecord(dict(job.spec), evidence, Verdict("OK", ["r"], {}), str(run), 30.0)
    write_json(run / "record.json", record.to_dict())
    return run


def test_merge_names_the_straggler_with_the_frame_its_host_saw(tmp_path):
    from nsadiag.hosts.offline import merge_run_dirs

    owns = {r: [0.03] * 8 for r in range(4)}
    owns[3] = [0.33] * 8
    events = job_events(owns)
    sleeping = {3: {"frame": "main (train.py:31)", "seen": 9, "of": 10}}
    runs = [_ended_run(tmp_path, "host1", [_rank(r, events[r]) for r in (0, 1)], {}),
            _ended_run(tmp_path, "host2", [_rank(r, events[r]) for r in (2, 3)], sleeping)]
    verdict = merge_run_dirs(runs)
    found = verdict.facts.ranks.straggler
    assert (found.rank, found.host, found.raw["node_rank"]) == (3, "host2", 1)
    assert found.raw["frame"] == sleeping[3] and found.seen_at is None
    assert found.sentence == verdict.reasons[-1]
    # `nsadiag merge` prints the verdict, then the straggler's sentence from its typed fact
    merged = nsadiag("merge", *map(str, runs))
    assert merged.stderr == "" and merged.stdout.splitlines() == [
        f"{verdict.name}: {verdict.reasons[0]}", found.sentence]
    assert verdict.reasons[-1].endswith("; its sampler saw it at main (train.py:31) in 9 of "
                                        "its last 10 pulses")


# ---- the top block of a run that finished with a straggler ------------------------------------


def _finished(name: str, straggler: dict | None, facts: dict | None = None) -> TrialRecord:
    spec = {"command": ["torchrun", "train.py"], "stall_timeout_s": 60.0,
            "deadline_s": 600.0, "subject": "the command", "kind": "run"}
    facts = {**(facts or {}), **({"straggler": straggler} if straggler else {})}
    return TrialRecord(spec, None, Verdict(name, ["r"], facts), "run", 30.0)


def _slow_rank(frame: dict | None) -> dict:
    owns = {r: [0.08] * (1 + STRAGGLER_STEPS) for r in (0, 1, 2)}
    owns[3] = [0.23] * (1 + STRAGGLER_STEPS)
    events = job_events(owns)
    found = find_straggler({r: step_paces(e) for r, e in events.items()},
                           {r: names(r) for r in owns}, {r: label(r) for r in owns},
                           {3: frame} if frame else {})
    assert found is not None
    return {**found.to_dict(), "seen_at": T0}


def test_a_finished_runs_top_block_names_the_straggler_its_figures_and_its_line():
    found = _slow_rank({"frame": "main (train.py:31)", "seen": 9, "of": 10})
    assert Straggler.from_dict(found).to_dict() == {k: v for k, v in found.items()
                                                    if k != "seen_at"}
    finding = run_finding(_finished("OK", found, {"steps_done": {"0": 6}}))
    top = "\n".join(top_block(finding))
    assert "Nothing to fix" not in top
    assert finding.headline == ("OK (healthy); straggler: rank 3 on host2 (local rank 1, "
                                "node 1), 2.8x")
    assert finding.culprit is not None and finding.culprit.where() == "train.py:31"
    assert finding.proof == (
        "rank 3 on host2 (local rank 1, node 1) spends 0.232 s per step outside collectives "
        "(at least 0.232 s at each of its steps 1-5) against a median of 0.082 s for the "
        "other 3 rank(s): 2.8x (last seen at 22:13:20 UTC)")
    assert finding.next_action == (
        "Rank 3 on host2 (local rank 1, node 1) spends 0.232 s per step outside "
        "collectives, 2.8x the others' median (0.082 s), at train.py:31 (in main; its "
        "sampler saw it there in 9 of its last 10 pulses): look there; the other 3 rank(s) "
        "wait for it in collectives (a median 0.150 s per step).")
    assert f"- **Next:** {finding.next_action}" in top
    assert "- **Line:** `train.py:31` — rank 3 on host2" in top
    assert finding.to_dict()["next_action"] == finding.next_action  # summary.json's


def test_without_its_frame_the_next_step_names_the_longer_part_of_its_step():
    finding = run_finding(_finished("SLOW", _slow_rank(None)))
    assert finding.culprit is None
    assert finding.next_action.startswith("Rank 3 on host2 (local rank 1, node 1) spends "
                                          "0.232 s per step outside collectives, 2.8x")
    assert "(0.082 s), with 0.138 s of its 0.232 s step before its backward (loading the " \
        "batch and forward): look there (its host's sampler named no frame); the other 3 " \
        "rank(s) wait" in finding.next_action
    # the SLOW's own next step stays, as the first recommendation
    assert finding.recommendations[0].startswith("Give the run more time")


def test_a_stuck_runs_top_block_keeps_its_own_culprit_and_a_run_without_one_is_unchanged():
    found = _slow_rank({"frame": "main (train.py:31)", "seen": 9, "of": 10})
    stuck = run_finding(_finished("STALL-BUSY", found))
    assert "straggler" not in stuck.headline and "Rank 3" not in stuck.next_action
    plain = run_finding(_finished("OK", None))
    assert plain.next_action == "Nothing to fix: it finished."


# ---- two hosts on one machine ---------------------------------------------------------------

REFUSED = unshare_refused()
SCRIPT = TESTS / "multihost_straggler.py"
SLEEP_LINE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1)
                  if "time.sleep(args.slow_s)" in line)


@pytest.mark.hosts
@pytest.mark.skipif(REFUSED is not None, reason=str(REFUSED))
def test_two_hosts_both_name_the_slow_rank_on_the_second_host(tmp_path):
    hosts = make_hosts(tmp_path)
    command = torchrun(SCRIPT, hosts[0], free_port(hosts[0].address), "--slow-rank", "3",
                       "--steps", "60")
    try:
        for host in hosts:
            start_host(host, ["--stall-timeout", "60", "--no-redact"], command)
        for host in hosts:
            code, _, err = host.communicate(timeout=300)
            assert code == 0, (host.name, code, err[-3000:])
    finally:
        for host in hosts:
            if host.proc is not None and host.proc.poll() is None:
                kill_host(host)
                host.proc.communicate(timeout=60)
    for host in hosts:
        record = json.loads((host.run_dir / "record.json").read_text())
        assert record["verdict"]["name"] == "OK", record["verdict"]
        found = record["evidence"]["hosts"]["straggler"]
        assert found is not None, host.name
        assert (found["rank"], found["host"], found["local_rank"]) == (3, "host2", 1)
        assert found["ratio"] >= STRAGGLER_RATIO
        assert found["forward_s"] >= 0.3  # its sleep, before its backward
        assert found["frame"]["frame"] == f"main (multihost_straggler.py:{SLEEP_LINE})"
        report = (host.run_dir / "report.md").read_text()
        assert "straggler: rank 3 on host2 (local rank 1, node 1) takes " in report
        summary = json.loads((host.run_dir / "summary.json").read_text())
        assert summary["straggler"]["rank"] == 3
        # the top block and the one next step name it, its figures and its line
        top = report.split("\n## ")[0]
        assert "Nothing to fix" not in top
        assert "straggler: rank 3 on host2 (local rank 1, node 1)" in top
        step = summary["finding"]["next_action"]
        assert step.startswith("Rank 3 on host2 (local rank 1, node 1) spends "), step
        assert f"at multihost_straggler.py:{SLEEP_LINE} (in main;" in step
        assert f"- **Next:** {step}" in top
    merged = nsadiag("merge", str(hosts[0].run_dir), str(hosts[1].run_dir))
    assert merged.returncode == 0, merged.stderr
    assert "straggler: rank 3 on host2 (local rank 1, node 1) takes " in merged.stdout
    assert f"its sampler saw it at main (multihost_straggler.py:{SLEEP_LINE}) in " \
        in merged.stdout


# ---- a straggler near the bar: named until it falls clearly below it ---------------------------


def decide_after(owns: dict[int, list[float]], named: int | None):
    events = job_events(owns)
    return find_straggler({r: step_paces(e) for r, e in events.items()},
                          {r: names(r) for r in owns}, {r: label(r) for r in owns},
                          named=named)


def _near_bar(times: float) -> dict[int, list[float]]:
    """Even ranks at 0.1 s own time per step, rank 3 at ``times`` that (the SLACK after the
    all_reduce comes on top of every rank's)."""
    owns = {r: [0.1] * (1 + STRAGGLER_STEPS) for r in (0, 1, 2)}
    owns[3] = [0.1 * times] * (1 + STRAGGLER_STEPS)
    return owns


def test_a_named_straggler_is_kept_just_below_the_bar_and_dropped_clearly_below_it():
    assert STRAGGLER_KEEP_RATIO < STRAGGLER_RATIO and STRAGGLER_KEEP_GAP_S < STRAGGLER_MIN_GAP_S
    named = decide_after(_near_bar(2.1), None)
    assert named is not None and named.rank == 3
    # at 1.8x it would not be named afresh, but once named it stays
    assert decide_after(_near_bar(1.8), None) is None
    kept = decide_after(_near_bar(1.8), named.rank)
    assert kept is not None and kept.rank == 3 and kept.ratio < STRAGGLER_RATIO
    # clearly below the bar (under STRAGGLER_KEEP_RATIO): dropped
    assert decide_after(_near_bar(1.5), named.rank) is None


def test_a_kept_straggler_needs_the_keep_gap_and_no_other_slow_rank():
    tiny = {r: [0.01] * (1 + STRAGGLER_STEPS) for r in (0, 1, 2)}
    tiny[3] = [0.035] * (1 + STRAGGLER_STEPS)  # 3x, but 25 ms more: under the keep gap
    assert decide_after(tiny, 3) is None
    both = _near_bar(2.5)
    both[1] = both[3]  # now rank 1 is as slow: two slow ranks are not one straggler
    assert decide_after(both, 3) is None


def test_a_rank_that_was_not_named_gains_nothing_from_another_ranks_naming():
    # rank 3 named before, rank 2 now at 1.8x and rank 3 even: nobody
    owns = _near_bar(1.0)
    owns[2] = [0.18] * (1 + STRAGGLER_STEPS)
    assert decide_after(owns, 3) is None
    # a new straggler over the full bar is named even when another was named before
    owns[2] = [0.25] * (1 + STRAGGLER_STEPS)
    found = decide_after(owns, 3)
    assert found is not None and found.rank == 2
