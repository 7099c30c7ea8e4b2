"""triage.json parsed once into the typed state: a stored file reads back into typed objects
(check results, the repeats' confidence, the base spec, where the time went) and writes out
byte for byte as it was stored; the verdicts a triage states beyond its trials' own."""

import json

import pytest

from nsadiag.checks import CheckResult
from nsadiag.spec import TrialSpec
from nsadiag.triage.decide import Confidence, ModuleTime
from nsadiag.triage.finding import check_module, check_status
from nsadiag.triage.state import TriageState
from nsadiag.verdict import Verdict, VerdictName
from nsadiag.verdict.triage import check_verdict, triage_verdict
from tests.helpers import FIXTURES, check_result, triage_state

PER_TOKEN_LOOP = FIXTURES / "triage" / "per-token-loop.json"
"""The triage.json of reports/regenerate.sh's triage-per-token-loop example: checks (one
passed, two not applicable), a sweep failing SLOW at 2 layers, two agreeing repeats, where
the time went, branch isolation skipped, a bisection with one test."""


def test_a_stored_triage_json_reads_back_typed_and_writes_out_identically():
    text = PER_TOKEN_LOOP.read_text()
    state = TriageState.from_dict(json.loads(text))
    assert isinstance(state.base_spec, TrialSpec) and state.base_spec.seq_len == 512
    assert all(isinstance(r, CheckResult) for r in state.checks.results)
    assert [r.status for r in state.checks.results] == ["OK", "NOT APPLICABLE",
                                                        "NOT APPLICABLE"]
    conf = state.repeats.confidence
    assert isinstance(conf, Confidence) and (conf.verdict, conf.text()) == ("SLOW", "2 of 2")
    assert conf.verdict is VerdictName.SLOW and not conf.flaky
    assert state.sweep.failing.verdict is VerdictName.SLOW
    hot = state.attribution.by_pattern[0]
    assert isinstance(hot, ModuleTime) and hot.seconds > 0
    assert all(isinstance(t, ModuleTime) for t in state.attribution.by_module or [])
    assert state.bisection.verdict is VerdictName.SLOW
    # what the engine writes (nsadiag.rundir.write_json) is the file as it was stored
    assert json.dumps(state.to_dict(), indent=1) + "\n" == text


def test_hand_written_states_of_every_stage_round_trip():
    failing = {"trial": "trial-1", "verdict": "DEADLOCK", "n_layers": 2, "reason": "frozen",
               "world_size": 1}
    checks = {"n_layers": 2, "results": [check_result("causality", "OK"),
                                         check_result("ckpt", "WRONG", "blocks.0", "off")]}
    stored = triage_state(
        checks=checks, stages_done=["env", "checks", "sweep", "repeats", "branches"],
        repeats={"runs": [failing], "reproduced": True, "confidence": {
            "verdict": "DEADLOCK", "agreeing": 2, "total": 3,
            "verdicts": ["DEADLOCK", "OK", "DEADLOCK"], "flaky": True}},
        branches={"skipped": "only the sel branch is computed"}).to_dict()
    again = TriageState.from_dict(json.loads(json.dumps(stored)))
    assert json.dumps(again.to_dict()) == json.dumps(stored)
    assert again.repeats.confidence.flaky and again.branches.skipped
    assert [r.failed for r in again.checks.results] == [False, True]


def test_a_check_out_of_time_stands_for_inconclusive_and_names_no_module():
    assert check_verdict("SLOW") is VerdictName.INCONCLUSIVE
    assert check_verdict("INCONCLUSIVE") is VerdictName.INCONCLUSIVE
    # a stall at the smallest size ends in seconds: a failure, not out of time
    assert check_verdict("STALL-BUSY") is VerdictName.STALL_BUSY
    assert check_verdict("WRONG") is VerdictName.WRONG
    cut = CheckResult("ckpt", False, Verdict("SLOW", ["cut"]), "blocks.1", "cut")
    assert (check_status(cut), check_module(cut)) == ("INCONCLUSIVE", None)
    wrong = CheckResult("ckpt", False, Verdict("WRONG", ["off"]), "blocks.1", "off")
    assert (check_status(wrong), check_module(wrong)) == ("WRONG", "blocks.1")
    absent = CheckResult("parity", True, Verdict("OK", ["n/a"], {"applicable": False}), None,
                         "n/a")
    assert check_status(absent) == "NOT APPLICABLE"


@pytest.mark.parametrize(("unconfirmed", "slow_by_size", "expected"), [
    (True, False, "INCONCLUSIVE"), (True, True, "INCONCLUSIVE"), (False, True, "SLOW"),
    (False, False, "OK")])
def test_a_triage_without_a_failure_states_its_verdict(unconfirmed, slow_by_size, expected):
    assert triage_verdict(unconfirmed, slow_by_size) == expected
