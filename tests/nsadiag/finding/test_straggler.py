"""A straggler in a finding's top block (nsadiag.finding.straggler.with_straggler): the
headline names the rank and how much slower, the proof gives its figures, the line is its
most seen frame when the finding names none, its next step comes first and a SLOW's own
next step follows; a stuck run's top block keeps its own culprit."""

import json

import pytest

from nsadiag.finding import Culprit, Finding
from nsadiag.finding.straggler import next_step, with_straggler
from nsadiag.verdict.straggler import Straggler
from nsadiag.verdictfacts import FactsError, StragglerFact, VerdictFacts

STRAGGLER = {"rank": 3, "label": "rank 3 on host2", "host": "host2", "local_rank": 1,
             "node_rank": 1, "steps": [40, 41, 42], "others": 3, "own_s": 0.6,
             "least_s": 0.55, "others_own_s": 0.2, "step_s": 0.7, "others_waited_s": 0.4,
             "forward_s": 0.5, "backward_s": 0.1,
             "frame": {"frame": "load_batch (data.py:31)", "seen": 8, "of": 10}}


def finding(verdict: str, next_action: str, culprit: Culprit | None = None) -> Finding:
    kind = {"OK": "healthy", "SLOW": "slow by defect", "DEADLOCK": "stuck"}[verdict]
    status = "healthy" if verdict == "OK" else "failure"
    return Finding(command="run", verdict=verdict, kind=kind, status=status,
                   headline=f"{verdict} ({kind})", subject="python train.py",
                   next_action=next_action, culprit=culprit)


def test_a_healthy_run_that_waited_for_one_rank_names_it_and_where_it_was():
    named = with_straggler(finding("OK", "Nothing to do."), STRAGGLER)
    assert named.headline == "OK (healthy); straggler: rank 3 on host2, 3.0x"
    assert named.proof == ("rank 3 on host2 spends 0.600 s per step outside collectives (at "
                           "least 0.550 s at each of its steps 40-42) against a median of "
                           "0.200 s for the other 3 rank(s): 3.0x")
    assert (named.culprit.file, named.culprit.line) == ("data.py", 31)
    assert named.culprit.why.startswith("rank 3 on host2 was here in 8 of its last 10 "
                                        "sampler pulses")
    assert named.next_action.startswith("Rank 3 on host2 spends 0.600 s per step outside "
                                        "collectives, 3.0x the others' median (0.200 s), at "
                                        "data.py:31 (in load_batch")
    assert named.recommendations == []  # "Nothing to do" is not kept as advice


def test_a_slow_runs_own_next_step_follows_and_its_line_is_kept():
    own = Culprit("model.py", 57, "the loop over `t` ran 2,048 times")
    named = with_straggler(finding("SLOW", "Replace the loop with tensor ops.", own),
                           {**STRAGGLER, "seen_at": 0})
    assert named.culprit is own
    assert named.recommendations == ["Replace the loop with tensor ops."]
    assert named.proof.endswith(": 3.0x (last seen at 00:00:00 UTC)")


def test_without_a_frame_the_next_step_is_the_longest_part_of_its_step():
    unseen = {**STRAGGLER, "frame": None}
    named = with_straggler(finding("OK", "Nothing to do."), unseen)
    assert named.culprit is None
    assert ("with 0.500 s of its 0.700 s step before its backward (loading the batch and "
            "forward): look there (its host's sampler named no frame)") in named.next_action


def test_the_next_step_names_its_backward_when_that_is_the_longer_part():
    backward = Straggler.from_dict({**STRAGGLER, "frame": None, "forward_s": 0.1,
                                    "backward_s": 0.5})
    assert next_step(backward) == (
        "Rank 3 on host2 spends 0.600 s per step outside collectives, 3.0x the others' "
        "median (0.200 s), with 0.500 s of its 0.700 s step in its backward: look there "
        "(its host's sampler named no frame); the other 3 rank(s) wait for it in "
        "collectives (a median 0.400 s per step).")


def test_a_stuck_run_or_no_straggler_leaves_the_finding_as_it_was():
    stuck = finding("DEADLOCK", "Release the lock.")
    assert with_straggler(stuck, STRAGGLER) is stuck
    healthy = finding("OK", "Nothing to do.")
    assert with_straggler(healthy, None) is healthy


def test_a_verdicts_straggler_is_typed_and_writes_back_the_same_json():
    stored = {**Straggler.from_dict(STRAGGLER).to_dict(), "seen_at": 1_700_000_000.5}
    facts = VerdictFacts.from_dict({"straggler": stored})
    found = facts.ranks.straggler
    assert isinstance(found, StragglerFact)
    assert (found.rank, found.label, found.host, found.ratio, found.seen_at) == (
        3, "rank 3 on host2", "host2", 3.0, 1_700_000_000.5)
    assert found.sentence.startswith("straggler: rank 3 on host2 takes 0.600 s per step")
    assert json.dumps(facts.to_dict()) == json.dumps({"straggler": stored})
    with pytest.raises(FactsError, match=r"^facts.straggler.rank: 'three' is not of type"):
        VerdictFacts.from_dict({"straggler": {**stored, "rank": "three"}})
