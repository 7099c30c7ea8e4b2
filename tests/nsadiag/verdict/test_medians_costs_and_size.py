"""Rows, verdicts and decisions that rest on what a trial measured, without running trials:
step medians and how many steps they cover, time per step against its expected cost, the
peak split into saved-for-backward and the rest, slow by size as no failure (reports, exit
codes, bisection), contention relative to usable CPUs, and the words of the rules for a
user's own command."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from nsadiag.ci import exit_code
from nsadiag.evidence import Evidence
from nsadiag.harness.machine import cpu_stat
from nsadiag.harness.trial import MEDIAN_STEPS, timing_step_fits
from nsadiag.probes.efficiency import step_cost
from nsadiag.report.markdown import results_table
from nsadiag.rundir import TrialRecord
from nsadiag.runmeta import RunMeta
from nsadiag.sweep import analyse, rest_outgrows_saved, row_from_record
from nsadiag.triage.decide import reproduces
from nsadiag.triage.state import TrialRef
from nsadiag.verdict import decide, is_failure
from nsadiag.verdict.load import contention, cpu_steal
from nsadiag.verdict.size_or_defect import far_above_cost, token_loop
from nsadiag.verdict.thresholds import DEFECT_COST_RATIO
from tests.helpers import VERDICT_FIXTURES, plain_spec, sweep_report, trial_record

MiB = 2**20
# a step of 1 GFLOP on a machine whose matmul runs at 100 GFLOP/s, where a dense block
# reaches half of that: the dense reference would take 1e9 / 5e10 = 0.02 s for it
RATES = {"flops_per_step": 10**9, "machine_flops_per_s": 1e11, "dense_efficiency": 0.5,
         "efficiency": 0.1, "host_reads_per_step": 0, "flops_per_op": 1e6,
         "dense_flops_per_op": 2e6}


def _measured(n_layers: int, verdict: str = "OK", step_s=(1.0, 0.30, 0.20, 0.25),
              peak=500 * MiB, saved=100 * MiB, slow_by: str | None = None,
              **result) -> TrialRecord:
    """A record of a trial that measured these step times, peak and saved bytes at
    RATES (``result`` adds fields), its verdict SLOW by ``slow_by`` when given."""
    measured = {"step_s": list(step_s), "forward_s": [0.1] * len(step_s),
                "backward_s": [0.1] * len(step_s), "steps_done": 2,
                "timing_steps": len(step_s) - 2, "peak_rss": peak, "saved_bytes": saved,
                **RATES, **result}
    facts = {"slow_by": slow_by} if slow_by else {}
    return trial_record(plain_spec(n_layers), measured, verdict, f"trial-{n_layers}",
                        facts=facts)


# ---- medians and timing steps ------------------------------------------------------------


def test_a_row_is_the_median_of_the_steps_after_step_0_and_says_how_many():
    row = row_from_record(_measured(2))
    assert row.step_s == pytest.approx(0.25) and row.timed_steps == MEDIAN_STEPS == 3
    assert row.steps_done == 2  # the asked steps; the other two were for the median
    only_two = row_from_record(_measured(2, step_s=(1.0, 0.3)))
    assert only_two.step_s == pytest.approx(0.3) and only_two.timed_steps == 1
    assert "| 0.25 | 3 |" in results_table([row])[2]


def test_timing_steps_run_only_while_the_next_fits_well_inside_the_budget():
    # two of the slowest step so far, plus 5 s to write the result, must end in the budget
    assert timing_step_fits([1.0, 0.5], elapsed_s=10.0, budget_s=17.0)
    assert not timing_step_fits([1.0, 0.5], elapsed_s=10.0, budget_s=16.9)
    assert not timing_step_fits([0.1] * (1 + MEDIAN_STEPS), elapsed_s=1.0, budget_s=600.0)
    assert not timing_step_fits([], elapsed_s=1.0, budget_s=600.0)


def test_a_budget_kill_after_every_asked_step_finished_is_ok():
    data = json.loads((VERDICT_FIXTURES / "slow_budget.json").read_text())
    data["event_counts"]["step"] = data["total_steps"] + 1  # one timing step ran, too
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "OK" and verdict.facts.position.budget_kill
    assert verdict.reasons[0].startswith(f"the child finished all {data['total_steps']} "
                                         f"steps; the budget ran out after")


# ---- time per step against its expected cost ------------------------------------------------


def test_time_per_step_is_set_against_the_dense_references_time_for_its_flops():
    cost = step_cost(RATES, 0.5)
    assert cost["expected_s"] == pytest.approx(0.02) and cost["ratio"] == pytest.approx(25.0)
    assert not far_above_cost(cost)
    assert far_above_cost(step_cost(RATES, DEFECT_COST_RATIO * 0.02))
    # the matmul rate cancels: a reading twice as high doubles the dense efficiency's
    # denominator and halves the efficiency alike, and the ratio stays
    again = step_cost({**RATES, "machine_flops_per_s": 2e11, "dense_efficiency": 0.25}, 0.5)
    assert again["ratio"] == pytest.approx(25.0)
    assert step_cost({**RATES, "dense_efficiency": None}, 0.5) is None
    row = row_from_record(_measured(2))
    assert row.expected_step_s == pytest.approx(0.02) and row.cost_ratio == pytest.approx(12.5)
    # the row's efficiency is the median step's: 1 GFLOP in 0.25 s at 100 GFLOP/s
    assert row.efficiency == pytest.approx(0.04)
    assert "| 12x |" in results_table([row])[2]  # two significant digits
    # an expected step under 10 ms is overhead, not arithmetic: its ratio means nothing
    short = dataclasses.replace(row, expected_step_s=0.002, cost_ratio=690.0)
    assert "| too short to time |" in results_table([short])[2]


def _test(**measured: object) -> TrialRef:
    """A bisection test's trial reference with what its work measured."""
    return TrialRef(trial="trial-1", **measured)


def test_a_bisection_test_reproduces_a_slow_by_its_work_not_by_its_budget():
    # finished its steps in time, but the counts say defect: the defect is there
    assert reproduces("SLOW", _test(verdict="OK", defect=True, cost_ratio=2.0))
    # SLOW only because its steps did not fit the budget: no defect, a normal cost
    assert not reproduces("SLOW", _test(verdict="SLOW", slow_by="size", defect=False,
                                        cost_ratio=3.0))
    # no count says defect, but a step took 150x its expected cost
    assert reproduces("SLOW", _test(verdict="OK", defect=False, cost_ratio=150.0))
    assert not reproduces("SLOW", _test(verdict="OK", defect=False, cost_ratio=690.0,
                                        expected_step_s=0.002))  # too short to time
    assert not reproduces("SLOW", _test(verdict="OK", defect=False, cost_ratio=40.0))
    # nothing measured: the verdict decides, and slow by size is not the failure
    assert reproduces("SLOW", _test(verdict="SLOW"))
    assert not reproduces("SLOW", _test(verdict="SLOW", slow_by="size"))
    # any other failure: the same verdict
    assert reproduces("DEADLOCK", _test(verdict="DEADLOCK", defect=True))
    assert not reproduces("DEADLOCK", _test(verdict="OK", defect=True))


# ---- memory rows ---------------------------------------------------------------------------


def test_rows_split_the_peak_and_a_peak_outgrowing_the_saved_bytes_is_called_out(tmp_path):
    # saved grows 2x from 1 to 4 layers; the rest grows 4x: something else sets the peak
    records = [_measured(1, peak=200 * MiB, saved=100 * MiB),
               _measured(2, peak=400 * MiB, saved=150 * MiB),
               _measured(4, peak=1000 * MiB, saved=200 * MiB)]
    rows = [row_from_record(r) for r in records]
    assert [r.rest_bytes for r in rows] == [100 * MiB, 250 * MiB, 800 * MiB]
    growth = rest_outgrows_saved(rows)
    assert growth["saved"] == pytest.approx(2.0) and growth["rest"] == pytest.approx(8.0)
    assert growth["peak"] == pytest.approx(5.0) and growth["outgrows"]
    assert "rest_bytes" in analyse(rows)["fits"]
    text, summary = sweep_report(tmp_path, records, RunMeta(command_name="sweep-layers"))
    implicated = [item["text"] for item in summary["finding"]["implicated"]]
    assert ("The peak outgrows what is saved for backward: from 1 to 4 layers the rest of "
            "the peak grew 8.0x, the saved bytes 2.0x") in " ".join(implicated)
    assert "| rest of the peak |" in text.splitlines()[text.splitlines().index(
        "## Measurements") + 2]
    steady = [_measured(n, peak=(400 + 20 * n) * MiB, saved=20 * n * MiB) for n in (1, 2, 4)]
    assert not rest_outgrows_saved([row_from_record(r) for r in steady])["outgrows"]


def test_the_rest_of_a_cuda_peak_leaves_out_the_saved_bytes_and_the_training_state(tmp_path):
    # on CUDA the tensors live on the device: its peak counts, not the host's RSS; the
    # parameters, gradients and AdamW state grow with depth but are no scratch
    records = [_measured(n, peak=1700 * MiB, saved=4 * n * MiB, peak_cuda=(80 + 145 * n) * MiB,
                         state_bytes=140 * n * MiB) for n in (1, 6, 12)]
    rows = [row_from_record(r) for r in records]
    assert [r.rest_bytes for r in rows] == [(80 + n) * MiB for n in (1, 6, 12)]
    assert [r.peak_cuda for r in rows] == [(80 + 145 * n) * MiB for n in (1, 6, 12)]
    assert not rest_outgrows_saved(rows)["outgrows"]
    text, _ = sweep_report(tmp_path, records, RunMeta(command_name="sweep-layers"))
    header = text.splitlines()[text.splitlines().index("## Measurements") + 2]
    assert "| peak RSS | peak CUDA | saved for backward |" in header
    # without the state (a record from before it was measured) the state is in the rest
    older = [_measured(n, peak=1700 * MiB, saved=4 * n * MiB, peak_cuda=(80 + 145 * n) * MiB)
             for n in (1, 6, 12)]
    assert [row_from_record(r).rest_bytes for r in older] == \
        [(80 + 141 * n) * MiB for n in (1, 6, 12)]


# ---- slow by size is no failure --------------------------------------------------------------


def test_slow_by_size_is_no_failure_in_a_sweep_report_or_its_exit_code(tmp_path):
    assert not is_failure("SLOW", "size") and is_failure("SLOW", "defect")
    assert is_failure("SLOW") and not is_failure("INCONCLUSIVE") and not is_failure("OK")
    records = [_measured(1), _measured(2), _measured(4, "SLOW", slow_by="size")]
    text, summary = sweep_report(tmp_path, records, RunMeta(command_name="sweep-layers"))
    assert summary["headline"] == "SLOW (slow by size) from 4 layers: no failure"
    assert summary["finding"]["kind"] == "slow by size"
    assert summary["threshold"] is None and exit_code(summary) == 0
    assert analyse([row_from_record(r) for r in records])["threshold"] is None
    assert "| SLOW (by size) |" in text
    records[2] = _measured(4, "SLOW", slow_by="defect")
    _, summary = sweep_report(tmp_path, records, RunMeta(command_name="sweep-layers"))
    assert summary["headline"] == "SLOW (slow by defect) at 4 layers" and \
        exit_code(summary) == 1
    # a single-verdict summary (ddp, run) carries slow_by too
    assert exit_code({"verdict": "SLOW", "slow_by": "size"}) == 0
    assert exit_code({"verdict": "SLOW", "slow_by": None}) == 1


# ---- load ----------------------------------------------------------------------------------


def _load(one: float, cpus: int, steal: tuple[int, int], got: float | None = 0.9) -> dict:
    start = {"loadavg": [one, one, one], "cpus": cpus,
             "cpu_stat": {"total": 10_000, "steal": 100}}
    end = {"loadavg": [one, one, one], "cpus": cpus,
           "cpu_stat": {"total": 10_000 + steal[1], "steal": 100 + steal[0]}}
    return {"start": start, "end": end, "main_thread": {"main": {"got": got}}}


def test_contention_is_judged_per_usable_cpu_with_steal_where_readable(tmp_path):
    quiet = contention(_load(2.0, 2, (0, 1000)))
    assert quiet["load_per_cpu"] == pytest.approx(1.0) and quiet["steal"] == 0.0
    assert not quiet["contended"]
    # a load the job makes itself (two ranks, each main thread asking for a whole CPU) is
    # no contention from elsewhere: 4.0 on 2 CPUs, less the job's 2.0
    own = _load(4.0, 2, (0, 1000))
    own["main_thread"] = {"rank-0": {"got": 0.9, "demand": 1.0},
                          "rank-1": {"got": 0.9, "demand": 1.0}}
    found = contention(own)
    assert found["load_per_cpu"] == pytest.approx(2.0)
    assert found["others_per_cpu"] == pytest.approx(1.0) and not found["contended"]
    # the same load average on one usable CPU is contention
    assert contention(_load(2.0, 1, (0, 1000)))["contended"]
    stolen = contention(_load(1.0, 2, (150, 1000)))
    assert stolen["steal"] == pytest.approx(0.15) and stolen["contended"]
    assert "15% of the CPU time stolen" in stolen["why"][0]
    starved = contention(_load(1.0, 2, (0, 1000), got=0.3))
    assert starved["contended"] and "received 30%" in starved["why"][0]
    assert cpu_steal({"total": 5, "steal": None}, {"total": 9, "steal": None}) is None
    assert contention(None) is None
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 10 0 3 40 7 0\ncpu0 1 2 3\n")
    assert cpu_stat(stat) == {"total": 1008, "steal": 40}
    stat.write_text("cpu  100 5 50 800\n")  # an old kernel: no steal column
    assert cpu_stat(stat) == {"total": 955, "steal": None}


def test_a_slow_with_no_count_behind_it_on_a_contended_machine_is_inconclusive():
    data = json.loads((VERDICT_FIXTURES / "slow_budget.json").read_text())
    assert not any("host_reads_per_step" in e for e in data["events"])  # nothing counted
    data["load"] = _load(6.0, 2, (0, 1000))
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "INCONCLUSIVE" and verdict.facts.position.would_be == "SLOW"
    assert any(r.startswith("the machine was contended (3.0 runnable tasks per usable CPU "
                            "besides the job's own)") for r in verdict.reasons)
    # a user's command at its own deadline did not finish, whatever the load: SLOW, with
    # the load figures beside it
    command = {**data, "spec": {"command": ["python", "train.py"], "stall_timeout_s": 30.0,
                                "deadline_s": 60.0}}
    verdict = decide(Evidence.from_dict(command))
    assert verdict.name == "SLOW" and verdict.facts.position.load.contended
    data["load"] = _load(1.0, 2, (0, 1000))
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW" and verdict.facts.position.load.contended is False
    # a count that says defect stands at any load
    counted = copy.deepcopy(data)
    counted["load"] = _load(6.0, 2, (0, 1000))
    counted["spec"]["seq_len"] = 512
    counted["events"][-1] = {**counted["events"][-1], "kind": "step", "step": 3,
                             "step_s": 2.0, "host_reads_per_step": 512, "flops_per_op": 1e3,
                             "dense_flops_per_op": 1e6, **{k: RATES[k] for k in (
                                 "flops_per_step", "machine_flops_per_s",
                                 "dense_efficiency")}}
    verdict = decide(Evidence.from_dict(counted))
    assert verdict.name == "SLOW" and verdict.facts.slow.slow_by == "defect"


# ---- the words of the rules for a user's own command -------------------------------------------


@pytest.mark.parametrize("fixture, child_says, command_says", [
    ("ok.json", "the child finished", "the command finished"),
    ("runtime_error.json", "the child raised RuntimeError", "the command raised RuntimeError"),
    ("sigsegv.json", "the child died of SIGSEGV", "the command died of SIGSEGV"),
])
def test_the_rules_speak_of_the_command_under_nsadiag_run(fixture, child_says, command_says):
    data = json.loads((VERDICT_FIXTURES / fixture).read_text())
    assert decide(Evidence.from_dict(data)).reasons[0].startswith(child_says)
    data["spec"] = {"command": ["python", "train.py"], "stall_timeout_s": 60.0,
                    "deadline_s": 3600.0}
    reasons = decide(Evidence.from_dict(data)).reasons
    assert reasons[0].startswith(command_says)
    assert not any("the child" in reason or "the runner" in reason for reason in reasons)


def test_a_command_exiting_non_zero_without_a_traceback_reads_as_the_command():
    data = json.loads((VERDICT_FIXTURES / "ok.json").read_text())
    data["spec"] = {"command": ["bash", "run.sh"], "stall_timeout_s": 60.0, "deadline_s": 60.0}
    data["result"], data["outcome"]["exit_code"] = None, 137
    reasons = decide(Evidence.from_dict(data)).reasons
    assert reasons[0] == "the command exited with code 137 without a Python traceback on stderr"
    assert reasons[1] == ("137 = 128 + SIGKILL: the shell or launcher that runs the command may "
                          "report a signal this way")


def test_progress_after_the_runners_decision_is_progress_at_the_kill_not_a_negative_gap():
    data = json.loads((VERDICT_FIXTURES / "slow_budget.json").read_text())
    # the runner decided 2 s before the last event: the child went on while being sampled
    data["outcome"]["ended_at"] = data["events"][-1]["t"] - 2.0
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW" and verdict.facts.position.since_last_event_s == 0.0
    assert verdict.reasons[0].endswith("came at the kill itself (it went on while its stacks "
                                       "were sampled)")


def _loop_profile(last: int, by_one: bool | None, phase: str = "forward") -> dict:
    return {"samples": 100, "duration_s": 20.0, "phases": {"build": 40, phase: 60},
            "hot_lines": [{"where": "forward (attn.py:27)", "file": "/u/attn.py", "line": 27,
                           "count": 50, "fraction": 0.5, "phase": phase}],
            "loops": [{"where": "forward (attn.py:26)", "variable": "t", "advanced": last,
                       "restarts": 0, "last": last, "rate_per_s": 400.0, "observations": 60,
                       "by_one": by_one}],
            "backward_ops": []}


def test_a_per_token_loop_the_profile_read_is_slow_by_defect_before_any_forward_was_counted():
    # a budget kill inside the first forward of a per-token loop on a busy machine: no
    # count yet, but the model's own counter stood at 5892 of 8192 tokens
    assert token_loop(_loop_profile(5892, True), 8192) == (
        "a per-token loop at attn.py:26 (loop variable `t` in forward (attn.py:26) counted to "
        "5892 within one pass over 8192 tokens)")
    assert token_loop(_loop_profile(100, True), 8192) is None  # far from one per token
    assert token_loop(_loop_profile(5892, False), 8192) is None  # range(0, S, 64): chunks
    assert token_loop(_loop_profile(5892, True, phase="build"), 8192) is None  # set-up
    data = json.loads((VERDICT_FIXTURES / "slow_budget.json").read_text())
    data["spec"]["seq_len"] = 8192
    data["profile"] = _loop_profile(5892, True)
    data["load"] = _load(6.0, 2, (0, 1000))  # contended: an uncounted SLOW would not stand
    verdict = decide(Evidence.from_dict(data))
    assert verdict.name == "SLOW" and verdict.facts.slow.slow_by == "defect"
    assert any(r.startswith("slow by defect: a per-token loop at attn.py:26") for r in
               verdict.reasons)
