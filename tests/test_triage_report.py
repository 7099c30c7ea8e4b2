"""The triage report from synthetic triage states (no trials): a WRONG check is a failure
with the check's reproduction, a stopped triage says what it did not reach, and a flaky
verdict is reported as k of n."""

import json

from nsadiag.ci import exit_code
from nsadiag.report.triage import build_triage_report

BASE_SPEC = {"target": "repro.late_bound_ckpt:make", "seq_len": 16, "batch": 1, "device": "cpu",
             "stall_timeout_s": 60.0, "seed": 0, "backend": None, "overrides": {"dim": 8}}


def _state(**changes):
    state = {"target": BASE_SPEC["target"], "argv": ["nsadiag", "triage"], "max_layers": 2,
             "max_minutes": 10, "trial_budget_s": 40.0, "user_budget_s": 600.0,
             "stages_done": ["env", "checks", "sweep"], "stopped": None,
             "base_spec": BASE_SPEC, "world_size": 1, "elapsed_s": 50.0,
             "env": {}, "env_problems": [],
             "sweep": {"probed": [{"trial": "trial-0", "verdict": "OK", "n_layers": 1,
                                   "reason": "ok"}],
                       "threshold": None, "deepest_ok": 1, "failing": None, "complete": True}}
    state.update(changes)
    return state


def _check(name, verdict, module=None, summary="fine"):
    return {"name": name, "passed": verdict == "OK", "module": module, "summary": summary,
            "table": [], "finished": True,
            "verdict": {"name": verdict, "reasons": [summary], "facts": {}}}


def test_a_wrong_check_is_the_failure_with_its_reproduction(tmp_path):
    checks = {"n_layers": 2, "results": [
        _check("causality", "OK", summary="nothing before t moved"),
        _check("ckpt", "WRONG", "blocks.0", "recompute of blocks.0 ran blocks.1's parameters")]}
    text, summary = build_triage_report(tmp_path, _state(checks=checks))
    assert text.startswith("# nsadiag triage: WRONG: the ckpt check fails in blocks.0")
    assert summary["status"] == "failure" and exit_code(summary) == 1
    assert summary["failure"]["check"] == "ckpt" and summary["failure"]["module"] == "blocks.0"
    assert [c["verdict"] for c in summary["checks"]] == ["OK", "WRONG"]
    assert ("nsadiag check ckpt --target repro.late_bound_ckpt:make --layers 2 --seq-len 16 "
            "--batch 1 --device cpu --stall-timeout 60 --seed 0 --set dim=8") in text
    assert ("`blocks.0` (ckpt check, WRONG): recompute of blocks.0 ran blocks.1's parameters"
            in text)
    assert "the causality check looks for: nothing before t moved" in text


def test_a_check_that_errors_is_a_failure(tmp_path):
    error = _check("ckpt", "ERROR", summary="CheckpointError: recomputed tensors differ")
    error["finished"] = False
    text, summary = build_triage_report(
        tmp_path, _state(checks={"n_layers": 2, "results": [error]}))
    assert summary["status"] == "failure" and exit_code(summary) == 1
    assert text.startswith("# nsadiag triage: ERROR: the ckpt check fails")
    assert "**ERROR**: the ckpt check: CheckpointError: recomputed tensors differ." in text


def test_a_check_that_did_not_finish_decides_nothing(tmp_path):
    unfinished = _check("parity", "SLOW", summary="the parity check did not finish: SLOW")
    unfinished["finished"] = False
    text, summary = build_triage_report(
        tmp_path, _state(checks={"n_layers": 2, "results": [unfinished]}))
    assert summary["status"] == "healthy" and exit_code(summary) == 0
    assert "Did not finish, so neither passed nor failed: parity (SLOW)" in text


def test_a_stopped_triage_says_what_it_did_not_reach(tmp_path):
    stopped = "stopped in the sweep stage: 12 s left, a trial needs at least 30 s"
    state = _state(stopped=stopped, stages_done=["env", "checks"])
    state["sweep"]["complete"] = False
    text, summary = build_triage_report(tmp_path, state)
    assert summary["complete"] is False and summary["stopped"] == stopped
    assert exit_code(summary) == 0, "running out of time is not a failure"
    assert "no failure found before the triage stopped (OK up to 1 layer(s))" in text
    assert "Not reached: sweep, repeats, attribution, branches, bisection." in text
    assert "**Incomplete:**" in text


def test_a_flaky_failure_is_reported_as_k_of_n(tmp_path):
    failing = {"trial": "trial-1", "verdict": "DEADLOCK", "n_layers": 2, "reason": "frozen"}
    state = _state(repeats={"runs": [failing], "confidence": {
        "verdict": "DEADLOCK", "agreeing": 2, "total": 3,
        "verdicts": ["DEADLOCK", "OK", "DEADLOCK"], "flaky": True}})
    state["sweep"].update(failing=failing, threshold=2)
    text, summary = build_triage_report(tmp_path, state)
    assert summary["failure"]["confidence"]["agreeing"] == 2
    assert "with **DEADLOCK** in 2 of 3 runs" in text
    assert "The verdict is flaky: the runs gave DEADLOCK, OK, DEADLOCK." in text
    assert "**DEADLOCK** in 2 of 3 runs (flaky)." in text
    json.dumps(summary)


def test_a_slow_verdict_the_repeats_do_not_confirm_is_inconclusive_not_a_failure(tmp_path):
    # a loaded machine: the sweep's run read SLOW, both repeats OK
    failing = {"trial": "trial-1", "verdict": "SLOW", "n_layers": 2, "reason": "budget"}
    state = _state(repeats={"runs": [failing], "reproduced": False, "confidence": {
        "verdict": "OK", "agreeing": 2, "total": 3, "verdicts": ["SLOW", "OK", "OK"],
        "flaky": True}})
    state["sweep"].update(failing=failing, threshold=2)
    text, summary = build_triage_report(tmp_path, state)
    assert summary["status"] == "inconclusive" and summary["failure"] is None
    assert exit_code(summary) == 4
    assert summary["headline"].startswith("inconclusive: SLOW at 2 layer(s) in 1 of 3 runs "
                                          "(SLOW, OK, OK), not reproduced")
    assert "Rerun on a quieter machine or with a larger `--budget`" in text


def test_a_failure_prints_how_many_runs_gave_its_own_verdict(tmp_path):
    # the repeats confirm a failure, but not the first run's verdict in every run
    failing = {"trial": "trial-1", "verdict": "STALL-BUSY", "n_layers": 2, "reason": "busy"}
    state = _state(repeats={"runs": [failing], "reproduced": True, "confidence": {
        "verdict": "DEADLOCK", "agreeing": 2, "total": 3,
        "verdicts": ["STALL-BUSY", "DEADLOCK", "DEADLOCK"], "flaky": True}})
    state["sweep"].update(failing=failing, threshold=2)
    text, summary = build_triage_report(tmp_path, state)
    assert summary["status"] == "failure"
    assert "with **STALL-BUSY** in 1 of 3 runs" in text


def test_a_failed_check_is_not_named_a_cause_of_a_slowness_measured_without_it(tmp_path):
    failing = {"trial": "trial-1", "verdict": "SLOW", "n_layers": 2, "reason": "budget"}
    state = _state(checks={"n_layers": 2, "results": [
        _check("causality", "WRONG", "blocks.0", "blocks.0 sees the future")]},
        repeats={"runs": [failing], "reproduced": True, "confidence": {
            "verdict": "SLOW", "agreeing": 2, "total": 2, "verdicts": ["SLOW", "SLOW"],
            "flaky": False}})
    state["sweep"].update(failing=failing, threshold=2)
    text, _ = build_triage_report(tmp_path, state)
    tied = text[text.index("The issue IS tied to:"):]
    separately = tied.index("Found separately by the correctness checks")
    assert tied.index("causality check, WRONG") > separately
