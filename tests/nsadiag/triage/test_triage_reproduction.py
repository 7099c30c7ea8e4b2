"""The triage's "smallest failing configuration" is one this triage saw fail with the
failure's own verdict: a bisection test that counted the defect but finished OK is never
named (its command prints OK), and the command named is the recorded failing trial's."""

import json

from nsadiag.finding.commands import reproduce
from nsadiag.spec import TrialSpec
from nsadiag.triage.finding import TriageFailure, decide_triage, reproducing_record
from nsadiag.triage.state import TriageState
from tests.helpers import triage_state, trial_record


def _record(trial: str, verdict: str, seq_len: int, facts: dict | None = None):
    spec = json.loads(TrialSpec(target="repro.per_token_loop:make", n_layers=1,
                                seq_len=seq_len, steps=1000, budget_s=20.0,
                                out_dir=trial).to_json())
    return trial_record(spec, {"step_s": [0.5], "steps_done": 3, "host_reads_per_step": seq_len},
                        verdict, trial, facts=facts or {})


def _slow_triage(minimal_verdict: str):
    """A triage whose sweep failed SLOW at 1 layer, S=256 (trial-1, confirmed by a repeat)
    and whose bisection's minimal test ran S=64 (trial-3) and ended ``minimal_verdict``."""
    failing = {"trial": "trial-1", "verdict": "SLOW", "n_layers": 1, "reason": "slow",
               "slow_by": "defect"}
    minimal = {"trial": "trial-3", "verdict": minimal_verdict, "n_layers": 1, "reason": "r",
               "defect": True}
    state = triage_state(
        max_layers=1, stages_done=["env", "sweep", "repeats", "bisection"],
        sweep={"probed": [failing], "threshold": 1, "deepest_ok": None, "failing": failing,
               "complete": True},
        repeats={"runs": [failing, {**failing, "trial": "trial-2"}], "reproduced": True,
                 "confidence": {"verdict": "SLOW", "agreeing": 2, "total": 2,
                                "verdicts": ["SLOW", "SLOW"], "flaky": False}},
        bisection={"verdict": "SLOW", "n_layers": 1, "changes": {"seq_len": 256},
                   "baseline": {"seq_len": 64}, "tests": [minimal], "minimal": {},
                   "minimal_trial": "trial-3"})
    slow = {"slow_by": "defect"}
    records = {"trial-1": _record("trial-1", "SLOW", 256, slow),
               "trial-2": _record("trial-2", "SLOW", 256, slow),
               "trial-3": _record("trial-3", minimal_verdict, 64,
                                  slow if minimal_verdict == "SLOW" else None)}
    return TriageState.from_dict(state.to_dict()), records


def test_a_minimal_test_that_finished_ok_is_not_named_as_the_failing_configuration():
    state, records = _slow_triage("OK")
    result = decide_triage(state, records)
    assert result.failure.minimal_trial == "trial-3"  # the bisection counted it there
    assert result.reproduction == reproduce(records["trial-1"].spec)
    assert "--seq-len 256" in " ".join(result.reproduction)
    assert f"`{' '.join(result.reproduction)}`" in result.finding.next_action
    assert ("minimal (ended OK)", "trial-3") in result.columns


def test_a_minimal_test_that_failed_with_the_verdict_is_the_smallest_failing_configuration():
    state, records = _slow_triage("SLOW")
    result = decide_triage(state, records)
    assert result.reproduction == reproduce(records["trial-3"].spec)
    assert "--seq-len 64" in " ".join(result.reproduction)
    assert ("minimal failing", "trial-3") in result.columns


def test_the_named_command_is_always_a_recorded_trial_that_failed_with_the_verdict():
    for minimal_verdict in ("OK", "SLOW", "INCONCLUSIVE"):
        state, records = _slow_triage(minimal_verdict)
        result = decide_triage(state, records)
        named = [r for r in records.values() if reproduce(r.spec) == result.reproduction]
        assert named and all(r.verdict_name == "SLOW" for r in named), minimal_verdict
    # no recorded trial ended with the verdict: no configuration is named
    failure = TriageFailure("SLOW", 1, "trial-1", "slow", minimal_trial="trial-3")
    assert reproducing_record(failure, {"trial-3": _record("trial-3", "OK", 64)}) is None
