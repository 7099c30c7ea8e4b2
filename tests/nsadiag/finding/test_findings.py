"""Findings as typed objects, without running a trial: the culprit is the defect's line
picked from the evidence (the loop a counter iterated, not the hottest healthy line), the
kinds, the summary's word limit, numbers rounded to what they support, and a check that
ran out of time deciding nothing."""

import json
from pathlib import Path

import pytest

from nsadiag.checks import CheckResult
from nsadiag.finding import Finding, fit_words, kind_of
from nsadiag.finding.check import check_finding
from nsadiag.finding.culprit import culprit_of
from nsadiag.finding.numbers import cost_ratio, duration, share, sig, size
from nsadiag.finding.trial import trial_finding
from nsadiag.recordspec import RecordSpec
from nsadiag.rundir import TrialRecord
from nsadiag.verdict import Verdict
from tests.helpers import REPRO, evidence_of

LOOP, BASE = str(REPRO / "per_token_loop.py"), str(REPRO / "_base.py")


def _slow_record(profile, slow_by="defect"):
    spec = {"target": "repro.per_token_loop:make", "n_layers": 1, "seq_len": 512, "batch": 1,
            "dtype": "float32", "device": "cpu", "steps": 200, "seed": 0, "grad_ckpt": False,
            "branches": None, "backend": None, "stall_timeout_s": 20.0, "budget_s": 20.0,
            "memory_cap_bytes": None, "overrides": {}}
    events = [{"t": 1.0, "kind": "step", "phase": "optimizer", "step": 0,
               "host_reads_per_step": 512, "compute_ops_per_step": 1029,
               "flops_per_op": 7591.0, "dense_flops_per_op": 1537911.0}]
    verdict = Verdict("SLOW", ["still progressing at the budget kill"],
                      {"slow_by": slow_by, "since_last_event_s": 0.0, "rate": 35.0,
                       "fraction_done": 0.86})
    return TrialRecord(spec, evidence_of(spec, {"events": events, "profile": profile}), verdict,
                       "/nonexistent/trial-0", 20.1)


def _hot(file, line, fraction, function="forward", phase="forward"):
    return {"where": f"{function} ({Path(file).name}:{line})", "file": file, "line": line,
            "code": None, "count": int(100 * fraction), "fraction": fraction, "phase": phase}


def test_the_loop_a_counter_iterated_is_the_culprit_not_the_hottest_healthy_line():
    # the healthy MLP is the hottest line; the per-token loop's counter advanced
    profile = {"hot_lines": [_hot(BASE, 17, 0.4), _hot(LOOP, 27, 0.15)],
               "loops": [{"where": "forward (per_token_loop.py:30)", "variable": "t",
                          "advanced": 3522, "restarts": 20, "last": 100,
                          "rate_per_s": 577.5, "observations": 40, "by_one": True}],
               "frames": []}
    culprit = culprit_of(_slow_record(profile))
    assert culprit.where() == "repro/per_token_loop.py:26-30"
    assert culprit.code.startswith("for t in range(x.shape[1]):")
    assert "3,522 iterations" in culprit.why


def test_without_a_counter_the_loop_around_a_hot_line_is_named_and_a_line_in_no_loop_never():
    around = culprit_of(_slow_record({"hot_lines": [_hot(BASE, 17, 0.4), _hot(LOOP, 28, 0.2)],
                                      "loops": []}))
    assert around.where() == "repro/per_token_loop.py:26-30"  # 17 sits in no loop
    assert culprit_of(_slow_record({"hot_lines": [_hot(BASE, 17, 0.6)], "loops": []})) is None
    # slow by size: the work itself, no line to blame
    assert culprit_of(_slow_record({"hot_lines": [_hot(LOOP, 28, 0.2)]}, "size")) is None


def test_a_slow_by_defect_trial_finding_proves_it_with_a_count_and_says_what_to_change():
    finding = trial_finding(_slow_record({"hot_lines": [_hot(LOOP, 27, 0.2)], "loops": []}),
                            "run")
    assert (finding.verdict, finding.kind, finding.status) == ("SLOW", "slow by defect",
                                                               "failure")
    assert finding.proof == ("512 host reads (`.item()`, `.tolist()`) per step for 512 "
                             "tokens: one per token")
    assert "repro/per_token_loop.py:26-30" in finding.next_action
    assert [i.text for i in finding.ruled_out][0].startswith("A hang: it was still progressing")
    again = Finding.from_dict(json.loads(json.dumps(finding.to_dict())))
    assert again == finding


@pytest.mark.parametrize("verdict, slow_by, kind", [
    ("SLOW", "defect", "slow by defect"), ("SLOW", "size", "slow by size"),
    ("SLOW", None, "slow, work not counted"), ("DEADLOCK", None, "stuck"),
    ("STALL-COLLECTIVE", None, "stuck"), ("STALL-BUSY", None, "stuck"),
    ("OOM", None, "crashed"), ("ERROR", None, "crashed"), ("CRASH", None, "crashed"),
    ("WRONG", None, "wrong"), ("OK", None, "healthy"), ("INCONCLUSIVE", None, "inconclusive")])
def test_every_verdict_has_its_kind(verdict, slow_by, kind):
    assert kind_of(verdict, slow_by) == kind


def test_the_summary_keeps_whole_sentences_within_150_words():
    sentences = [" ".join(["word"] * 60) + "."] * 3
    kept = fit_words(sentences)
    assert len(kept) == 2 and sum(len(s.split()) for s in kept) == 120
    assert len(fit_words([" ".join(["w"] * 400)])[0].split()) == 150


def test_numbers_carry_the_digits_their_measurement_supports():
    assert (sig(12.5), sig(0.000423), sig(1234.0), sig(8.0)) == ("12", "0.00042", "1,200",
                                                                 "8.0")
    assert (share(0.0036), share(0.57)) == ("0.36%", "57%")
    assert (duration(40), duration(720), duration(7320)) == ("40 s", "12 min", "2.0 h")
    assert size(1.5 * 2**30) == "1.50 GiB"
    # a step whose expected cost is under 10 ms is overhead: its ratio means nothing
    assert cost_ratio(0.002, 690.0) is None and cost_ratio(0.02, 25.0) == 25.0


def test_a_check_that_ran_out_of_time_is_inconclusive_and_names_no_module():
    slow = CheckResult("parity", False, Verdict("SLOW", ["still progressing at the budget"]),
                       "blocks.1", "the parity check did not finish: SLOW")
    ok = CheckResult("causality", True, Verdict("OK", ["fine"]), None, "nothing moved")
    finding = check_finding([ok, slow], RecordSpec(target="nsa", seq_len=64, budget_s=40.0))
    assert (finding.verdict, finding.status, finding.culprit) == ("INCONCLUSIVE",
                                                                  "inconclusive", None)
    assert [i.mark for i in finding.results] == ["ok", "warn"]
    assert "blocks.1" not in json.dumps(finding.to_dict())
