"""A healthy model must never fail a triage: a correctness check that runs out of time is
fitted to its budget (a shorter sequence, then one layer) and says what it checked, or is
INCONCLUSIVE for that check (never a failure, no module named, no exit 1); a triage's
report says how contended the machine was, with the figures."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nsadiag import checks
from nsadiag.checks import fitted_sizes, run_check
from nsadiag.ci import exit_code
from nsadiag.report.triage import build_triage_report
from nsadiag.spec import TrialSpec
from nsadiag.triage.finding import decide_triage
from nsadiag.verdict.load import machine_sentence, worst_contention
from tests.helpers import check_result, nsadiag, triage_state, trial_record


def test_a_check_that_runs_out_of_time_is_fitted_to_its_budget(tmp_path):
    # ckpt at S=2048 needs minutes on this target (its work grows as S^3); 20 s cannot hold
    # it on any machine, and S=512 takes a fraction of a second
    spec = TrialSpec(target="tests.budget_targets:size_bound", n_layers=2, seq_len=2048,
                     budget_s=20.0, stall_timeout_s=60.0).validate()
    result = run_check("ckpt", spec, tmp_path)
    assert (result.passed, result.failed, result.verdict.name, result.module) == (
        True, False, "OK", None), result.summary
    assert result.summary.startswith(
        "checked at S=512, 2 layer(s): S=2048, 2 layer(s) did not finish within the 20 s "
        "budget ("), result.summary
    fitted = result.verdict.facts.check.fitted
    assert (fitted["seq_len"], fitted["n_layers"], fitted["asked"]) == (
        512, 2, {"seq_len": 2048, "n_layers": 2})
    assert [c["verdict"] for c in fitted["cut_short"]][0] in ("SLOW", "INCONCLUSIVE")
    assert (tmp_path / "ckpt" / "fit-S512-L2" / "check.json").is_file()


def _fake_jobs(monkeypatch, verdicts: list[str]) -> list[TrialSpec]:
    ran = []

    def run_check_job(name, spec, world_size=1):
        ran.append(spec)
        verdict = verdicts[len(ran) - 1]
        return trial_record({}, None, verdict, "trial",
                            events=[{"module": "blocks.1", "phase": "backward"}],
                            reasons=[f"{verdict}: still running"], wall_s=30.0)

    monkeypatch.setattr(checks, "run_check_job", run_check_job)
    return ran


def test_a_check_no_size_fits_is_inconclusive_and_names_no_module(monkeypatch, tmp_path):
    ran = _fake_jobs(monkeypatch, ["INCONCLUSIVE", "SLOW", "SLOW"])
    spec = TrialSpec(n_layers=2, seq_len=2048, budget_s=30.0).validate()
    result = run_check("ckpt", spec, tmp_path)
    assert [(s.seq_len, s.n_layers) for s in ran] == [(2048, 2), (512, 2), (128, 1)]
    assert (result.verdict.name, result.passed, result.failed, result.module) == (
        "INCONCLUSIVE", False, False, None)
    assert result.summary.startswith("inconclusive: the ckpt check did not finish within its "
                                     "30 s budget at any size, so nothing was compared (")
    assert "S=2048, 2 layer(s): INCONCLUSIVE after 30 s, reached blocks.1 backward" in \
        result.summary
    assert [row["seq_len"] for row in result.table] == [2048, 512, 128]
    assert result.to_dict()["failed"] is False


def test_a_stall_at_the_smallest_size_and_an_error_stay_failures(monkeypatch, tmp_path):
    spec = TrialSpec(n_layers=2, seq_len=2048, budget_s=30.0).validate()
    _fake_jobs(monkeypatch, ["SLOW", "SLOW", "STALL-BUSY"])
    stalled = run_check("ckpt", spec, tmp_path)
    assert (stalled.verdict.name, stalled.failed, stalled.module) == (
        "STALL-BUSY", True, "blocks.1")
    ran = _fake_jobs(monkeypatch, ["ERROR"])
    errored = run_check("ckpt", spec, tmp_path)
    assert (len(ran), errored.verdict.name, errored.failed) == (1, "ERROR", True)


def test_sizes_are_fitted_down_to_the_floor_once_each():
    assert [(s.seq_len, s.n_layers) for s in fitted_sizes(TrialSpec(seq_len=2048))] == [
        (2048, None), (512, None), (128, 1)]
    assert [(s.seq_len, s.n_layers) for s in fitted_sizes(TrialSpec(seq_len=256,
                                                                     n_layers=1))] == [
        (256, 1), (128, 1)]
    assert [(s.seq_len, s.n_layers) for s in fitted_sizes(TrialSpec(seq_len=64,
                                                                    n_layers=1))] == [(64, 1)]


@pytest.mark.parametrize("stored", ["as recorded before", "with failed"])
def test_a_check_out_of_time_never_fails_a_triage(tmp_path, stored):
    # the timed-out check as it read: INCONCLUSIVE at blocks.1 (a contended machine turned
    # its budget's SLOW into INCONCLUSIVE); the layer sweep is healthy
    cut = check_result("ckpt", "INCONCLUSIVE", "blocks.1",
                       "the ckpt check did not finish: INCONCLUSIVE: still progressing")
    cut["finished"] = False
    if stored == "with failed":
        cut.update(failed=False, module=None)
    checks_state = {"n_layers": 2, "results": [check_result("causality", "OK"), cut]}
    state = triage_state(checks=checks_state)
    text, summary = build_triage_report(tmp_path, state, {}, decide_triage(state, {}))
    assert exit_code(summary) in (0, 4) and summary["failure"] is None, summary["headline"]
    assert "blocks.1" not in text.split("## Root cause")[1]  # nothing implicated
    assert "A correctness check failed" not in text
    assert "⚠ ckpt: INCONCLUSIVE: did not finish within its time budget" in text


def _load(loadavg: float, got: float, cpus: int = 2) -> dict:
    reading = {"loadavg": [loadavg, loadavg, loadavg], "cpus": cpus}
    return {"start": reading, "end": reading,
            "main_thread": {"1": {"got": got, "demand": 1.0}}}


def test_the_machine_sentence_quotes_the_busiest_trials_figures():
    quiet = worst_contention([_load(0.9, 0.99), None])
    assert machine_sentence(quiet).startswith("not contended during any of 1 trial(s); the "
                                              "busiest: load average 0.9 on 2 usable CPU(s)")
    shared = worst_contention([_load(0.9, 0.99), _load(3.0, 0.64)])
    assert machine_sentence(shared) == (
        "shared with other work during the 2 trial(s), below the contention that makes a "
        "timing verdict inconclusive; the busiest: load average 3.0 on 2 usable CPU(s), 1.0 "
        "runnable tasks per usable CPU besides the trial's own, the main thread received 64% "
        "of the CPU it asked for")
    contended = worst_contention([_load(7.0, 0.3), _load(0.9, 0.99)])
    assert machine_sentence(contended).startswith(
        "contended during 1 of 2 trial(s) (3.0 runnable tasks per usable CPU besides the "
        "job's own; the main thread received 30% of the CPU it asked for): a timing verdict "
        "there needs a quieter machine to confirm it; the busiest: load average 7.0")
    assert worst_contention([None, {}]) is None


def test_a_healthy_triage_under_burners_says_how_busy_the_machine_was(tmp_path):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(max(2, len(os.sched_getaffinity(0))))]
    try:
        out = tmp_path / "run"
        done = nsadiag(
            "triage", "--set", "dim=32", "--set", "n_heads=4", "--set", "n_kv_heads=2",
            "--set", "head_dim=8", "--set", "l=8", "--set", "d=4", "--set", "l_sel=16",
            "--set", "n_sel=3", "--set", "w=16", "--seq-len", "64", "--steps", "2",
            "--stall-timeout", "60", "--max-minutes", "4", "--max-layers", "1", "--no-checks",
            "--out", str(out), timeout=400)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert done.returncode in (0, 4), (done.stdout, done.stderr)
    report = (out / "report.md").read_text()
    line = next(line for line in report.splitlines() if line.startswith("Machine: "))
    assert line.startswith(("Machine: contended during", "Machine: shared with other work")), line
    assert "usable CPU(s)" in line and "of the CPU it asked for" in line
