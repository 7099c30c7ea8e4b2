"""The triage's finding from synthetic triage states (no trials): a WRONG check is the
failure with the check's reproduction, a check that ran out of time decides nothing and
names no module, a stopped triage says what it did not reach, a flaky verdict is k of n,
a timing verdict the repeats do not confirm is inconclusive. Findings are checked as
typed objects; the report's layout once."""

import json

from nsadiag.ci import exit_code
from nsadiag.finding import Finding
from nsadiag.report.triage import build_triage_report
from nsadiag.triage.finding import TriageResult, decide_triage
from nsadiag.triage.state import TriageState
from tests.helpers import check_result, triage_state


def _decided(state: TriageState) -> tuple[TriageState, dict, TriageResult]:
    """What the triage report lays out for a state with no stored trials: the state, its
    trials and the finding decided with what was measured beside it."""
    return state, {}, decide_triage(state, {})


def _failing(state, verdict, agreeing, verdicts, reproduced=True):
    failing = {"trial": "trial-1", "verdict": verdict, "n_layers": 2, "reason": "frozen"}
    changed = state.to_dict()
    changed["sweep"].update(failing=failing, threshold=2)
    changed["repeats"] = {"runs": [failing], "reproduced": reproduced, "confidence": {
        "verdict": verdicts[0] if reproduced else "OK", "agreeing": agreeing,
        "total": len(verdicts), "verdicts": verdicts,
        "flaky": agreeing < len(verdicts)}}
    return TriageState.from_dict(changed)


def test_the_state_round_trips_through_triage_json():
    state = _failing(triage_state(), "DEADLOCK", 2, ["DEADLOCK", "OK", "DEADLOCK"])
    again = TriageState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state and again.failing.trial == "trial-1"
    assert again.labels() == {"trial-0": "sweep"}


def test_a_wrong_check_is_the_failure_with_its_reproduction(tmp_path):
    checks = {"n_layers": 2, "results": [
        check_result("causality", "OK", summary="nothing before t moved"),
        check_result("ckpt", "WRONG", "blocks.0",
                     "recompute of blocks.0 ran blocks.1's parameters")]}
    result = decide_triage(triage_state(checks=checks), {})
    finding = result.finding
    assert (finding.verdict, finding.kind, finding.status) == ("WRONG", "wrong", "failure")
    assert finding.culprit.module == "blocks.0" and "blocks.1's parameters" in finding.proof
    assert result.failure.check == "ckpt" and result.failure.module == "blocks.0"
    assert (" ".join(result.reproduction) == "nsadiag check ckpt --target "
            "repro.late_bound_ckpt:make --layers 2 --seq-len 16 --batch 1 --device cpu "
            "--stall-timeout 60 --seed 0 --set dim=8")
    assert [i.text for i in finding.ruled_out] == [
        "A failure at 1 layer(s) or fewer with this configuration: trial `trial-0` is OK.",
        "Wrong results of the kind the causality check looks for: nothing before t moved."]
    assert [i.mark for i in finding.implicated] == ["fail"]
    # the layout: the top block names verdict and kind first, then the module
    text, summary = build_triage_report(tmp_path, *_decided(triage_state(checks=checks)))
    assert text.startswith("# nsadiag triage: ❌ WRONG (wrong): the ckpt check fails in "
                           "blocks.0\n- **Run:**")
    assert exit_code(summary) == 1 and Finding.from_dict(summary["finding"]) == finding
    assert [c["verdict"] for c in summary["checks"]] == ["OK", "WRONG"]


def test_a_check_that_errors_is_a_failure():
    error = check_result("ckpt", "ERROR", summary="CheckpointError: recomputed tensors differ")
    finding = decide_triage(triage_state(checks={"n_layers": 2, "results": [error]}), {}).finding
    assert (finding.verdict, finding.kind, finding.status) == ("ERROR", "crashed", "failure")
    assert finding.headline == "ERROR (crashed): the ckpt check fails"


def test_a_check_that_ran_out_of_time_is_inconclusive_for_it_and_names_no_module(tmp_path):
    for verdict in ("SLOW", "INCONCLUSIVE"):
        unfinished = check_result("parity", verdict, module="blocks.1",
                                  summary=f"the parity check did not finish: {verdict}")
        state = triage_state(checks={"n_layers": 2, "results": [unfinished]})
        result = decide_triage(state, {})
        assert result.finding.status == "healthy" and result.failure is None
        assert result.check_status == {"parity": "INCONCLUSIVE"}
        assert result.check_module == {"parity": None}  # decided before any report
        assert result.finding.results[0].mark == "warn"
        assert "blocks.1" not in " ".join(i.text for i in result.finding.implicated)
        _, summary = build_triage_report(tmp_path, *_decided(state))
        assert exit_code(summary) == 0
        assert summary["checks"] == [{"name": "parity", "passed": False, "module": None,
                                      "summary": unfinished["summary"],
                                      "verdict": "INCONCLUSIVE"}]


def test_a_stopped_triage_says_what_it_did_not_reach():
    stopped = "stopped in the sweep stage: 12 s left, a trial needs at least 30 s"
    state = triage_state(stopped=stopped, stages_done=["env", "checks"])
    state.sweep.complete = False
    result = decide_triage(state, {})
    assert result.finding.status == "healthy", "running out of time is not a failure"
    assert result.finding.headline == ("OK (healthy): no failure found before the triage "
                                       "stopped (OK up to 1 layer(s))")
    assert result.not_reached == ["sweep", "repeats", "attribution", "branches", "bisection"]
    assert any(s.startswith("Incomplete: stopped in the sweep stage")
               for s in result.finding.summary)
    assert "--max-minutes" in result.finding.next_action


def test_a_flaky_failure_is_reported_as_k_of_n():
    state = _failing(triage_state(), "DEADLOCK", 2, ["DEADLOCK", "OK", "DEADLOCK"])
    result = decide_triage(state, {})
    finding = result.finding
    assert (finding.verdict, finding.kind) == ("DEADLOCK", "stuck")
    assert result.failure.confidence.agreeing == 2
    assert finding.summary[0].startswith("The target fails at 2 layer(s) with DEADLOCK in 2 "
                                         "of 3 runs")
    assert "The verdict is flaky: the runs gave DEADLOCK, OK, DEADLOCK." in finding.summary
    assert any("flaky" in r for r in finding.recommendations)
    assert any(i.text.startswith("repeats: DEADLOCK in 2 of 3 runs") and i.mark == "warn"
               for i in finding.results)


def test_a_slow_verdict_the_repeats_do_not_confirm_is_inconclusive_not_a_failure(tmp_path):
    # a loaded machine: the sweep's run read SLOW, both repeats OK
    state = _failing(triage_state(), "SLOW", 2, ["SLOW", "OK", "OK"], reproduced=False)
    result = decide_triage(state, {})
    assert result.failure is None
    assert (result.finding.verdict, result.finding.status) == ("INCONCLUSIVE", "inconclusive")
    assert result.finding.headline.startswith("INCONCLUSIVE (inconclusive): SLOW at 2 "
                                              "layer(s) in 1 of 3 runs (SLOW, OK, OK), not "
                                              "reproduced")
    _, summary = build_triage_report(tmp_path, *_decided(state))
    assert exit_code(summary) == 4


def test_a_failure_prints_how_many_runs_gave_its_own_verdict():
    # the repeats confirm a failure, but not the first run's verdict in every run
    state = _failing(triage_state(), "STALL-BUSY", 1, ["STALL-BUSY", "DEADLOCK", "DEADLOCK"])
    finding = decide_triage(state, {}).finding
    assert finding.status == "failure"
    assert "with STALL-BUSY in 1 of 3 runs" in finding.summary[0]


def test_a_failed_check_is_not_named_a_cause_of_a_slowness_measured_without_it():
    checks = {"n_layers": 2, "results": [
        check_result("causality", "WRONG", "blocks.0", "blocks.0 sees the future")]}
    state = _failing(triage_state(checks=checks), "SLOW", 2, ["SLOW", "SLOW"])
    result = decide_triage(state, {})
    assert result.finding.verdict == "SLOW"
    assert [i.text for i in result.separately] == [
        "`blocks.0` (causality check, WRONG): blocks.0 sees the future."]
    assert not any("causality" in i.text for i in result.finding.implicated)
