"""The triage report: Markdown and summary.json laid out from the triage's decided result.

Every decision is nsadiag.triage.finding's: the finding `nsadiag triage` kept as it ended
(``triage_finding``), and what its state and trials say beside it (``measure_triage``);
this module only formats.
The top block and summary of the finding come first, then the seed reports' order:
results (one line each, ✅ ❌ ⚠), environment, configuration comparison, systematic results
(checks, layer threshold with its plot, efficiency, repeats, where the time goes, branch
isolation, knob bisection), evidence (with a flame graph of the failing trial's profile),
root cause (ruled out, implicated), minimal reproduction, recommendations, regression,
time. The state is the run directory's triage.json (nsadiag.triage.state), the trials its
trials.jsonl; nsadiag.report.dispatch writes what ``build_triage_report`` returns.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from nsadiag.checks import CheckResult
from nsadiag.finding.numbers import share
from nsadiag.fmt import bytes_cell, seconds_cell
from nsadiag.report.markdown import (
    cost_text,
    evidence_section,
    results_table,
    spec_cell,
)
from nsadiag.report.plots import flame_section, sweep_plot
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary, verdict_row
from nsadiag.report.top import cause_section, items, recommendations
from nsadiag.rundir import TrialRecord
from nsadiag.triage.decide import BASELINE
from nsadiag.triage.finding import TriageResult, knob_text, time_text
from nsadiag.triage.state import TriageState

CONFIG_FIELDS = ("target", "n_layers", "seq_len", "batch", "dtype", "grad_ckpt", "branches",
                 "backend", "world_size", "device", "steps", "budget_s", "overrides")


def _env_section(state: TriageState) -> list[str]:
    env = state.env
    if env is None:
        return ["The environment was not recorded."]
    lines = ["| item | value |", "|---|---|",
             f"| python | {env.python or '-'} |", f"| torch | {env.torch or '-'} |",
             f"| platform | {env.platform or '-'} |",
             f"| CPUs / torch threads | {env.cpu_count} / {env.torch_threads} |",
             f"| CUDA | {env.cuda or '-'} |", f"| py-spy | {env.py_spy or '-'} |",
             f"| ptrace | {env.ptrace or '-'} |"]
    problems = state.env_problems
    return lines + ["", "Problems: " + ("; ".join(problems) if problems else "none found.")]


def _config_section(result: TriageResult, records: dict[str, TrialRecord]) -> list[str]:
    columns = [(name, records[trial]) for name, trial in result.columns if trial in records]
    if not columns:
        return ["No trial finished."]
    lines = ["| field | " + " | ".join(name for name, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for key in CONFIG_FIELDS:
        values = [spec_cell(key, r.spec.to_dict().get(key, 1 if key == "world_size" else None))
                  for _, r in columns]
        lines.append(f"| {key} | " + " | ".join(values) + " |")
    lines.append("| **verdict** | " + " | ".join(f"**{r.verdict_name}**" for _, r in columns)
                 + " |")
    return lines


def _checks_section(state: TriageState, result: TriageResult) -> list[str]:
    checks = state.checks
    if checks is None:
        return ["Not reached."]
    if checks.skipped:
        return [f"Skipped ({checks.skipped})."]
    if not checks.results:
        return ["No check ran."]
    lines = [f"At {checks.n_layers} layer(s):", "", "| check | verdict | module | finding |",
             "|---|---|---|---|"]
    for c in checks.results:
        module = result.check_module[c.name] or "-"
        lines.append(f"| {c.name} | {result.check_status[c.name]} | {module} | {c.summary} |")
    return lines


def _threshold_section(state: TriageState, result: TriageResult, run_dir: Path) -> list[str]:
    sweep = state.sweep
    if sweep is None:
        return ["Not reached."]
    lines = []
    if sweep.probed:
        lines.append("Probed in this order (doubling, then bisecting): " + ", ".join(
            f"{r.n_layers} → {r.verdict}" for r in sweep.probed) + ".")
    if sweep.threshold:
        lines.append(f"Threshold: **{sweep.threshold} layer(s)** (deepest OK: "
                     f"{sweep.deepest_ok or 'none'}).")
    elif sweep.complete:
        lines.append(f"Every probed depth up to {state.max_layers} layer(s) is OK.")
    lines += ["", "All trials:", ""] + results_table(result.rows)
    depth = [r for r in result.rows if r.label == "sweep"]
    png = sweep_plot({"sweep": depth}, {"sweep": dict(result.depth.fits)},
                     run_dir / "sweep.png", {"sweep": f"layer threshold ({state.target})"},
                     memory=result.depth.memory, cliff=result.depth.cliff)
    if png:
        lines += ["", f"![time and memory against layers, with the fits]({png.name})"]
    return lines


def _efficiency_section(state: TriageState) -> list[str]:
    refs = [r for r in (state.sweep.probed if state.sweep else [])
            if r.dense_efficiency is not None]
    if not refs:
        return ["No trial measured its FLOPs against the dense reference."]
    lines = ["A step's expected cost is a plain dense transformer block's time on this "
             "machine for the step's FLOPs (batch, sequence length and width of the target).",
             "", "| trial | layers | verdict | step s | median of | vs expected | "
             "efficiency | dense reference | defect counted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in refs:
        defect = {True: "yes", False: "no"}.get(r.defect, "-")
        lines.append(f"| {r.trial} | {r.n_layers} | {r.verdict} | {seconds_cell(r.step_s)} | "
                     f"{r.timed_steps} | {cost_text(r.expected_step_s, r.cost_ratio)} | "
                     f"{_percent(r.efficiency)} | {_percent(r.dense_efficiency)} | {defect} |")
    return lines


def _percent(value: float | None) -> str:
    return "-" if value is None else share(value)


def _attribution_section(state: TriageState) -> list[str]:
    a = state.attribution
    if a is None or not a.by_pattern:
        return []
    lines = ["", f"### Where the time goes (trial `{a.trial}`, the last {a.span_s:.1f} s of "
                 f"training)", "",
             "| module (all layers) | phase | seconds | share | still open at the end |",
             "|---|---|---|---|---|"]
    for t in a.by_pattern:
        share = f"{100 * t.seconds / a.span_s:.0f}%" if a.span_s > 0 else "-"
        lines.append(f"| {t.module} | {t.phase} | {t.seconds:.2f} | {share} | {t.open} |")
    return lines


def _branches_section(state: TriageState, result: TriageResult) -> list[str]:
    branches = state.branches
    if branches is None:
        return []
    if branches.skipped:
        return ["", "### Branch isolation", "", f"Skipped: {branches.skipped}."]
    rows = {Path(r.trial_dir).name: r for r in result.rows}
    lines = ["", f"### Branch isolation ({branches.n_layers} layer(s), one branch computed)",
             "", "| branch | verdict | step s | peak RSS | trial |", "|---|---|---|---|---|"]
    for ref in branches.runs:
        row = rows.get(ref.trial)
        lines.append(f"| {ref.branch} | {ref.verdict} | "
                     f"{seconds_cell(row.step_s if row else None)} | "
                     f"{bytes_cell(row.peak_rss if row else None)} | {ref.trial} |")
    return lines


def _bisection_section(state: TriageState) -> list[str]:
    b = state.bisection
    if b is None:
        return []
    lines = ["", "### Knob bisection (delta debugging towards the healthy baseline)", "",
             f"Changes against the baseline: {knob_text(b.changes)} (baseline: "
             f"{knob_text(b.baseline)}), at {b.n_layers} layer(s). "
             + ("A test reproduces a SLOW when its work shows the defect (its counts, or a "
                "step far above its expected cost), whatever its verdict." if b.verdict ==
                "SLOW" else f"A test reproduces the failure when it ends {b.verdict}."), ""]
    if not b.changes:
        return lines + ["No knob differs from the baseline: nothing to bisect."]
    lines += ["| changes applied | verdict | step s | vs expected cost | defect counted | "
              "reproduces | trial |", "|---|---|---|---|---|---|---|"]
    failing = state.sweep.failing if state.sweep else None
    shown = ([(f"all ({', '.join(b.changes)})", failing, True)] if failing else []) + [
        (", ".join(t.applied or []) or "none (baseline)", t, t.reproduces) for t in b.tests]
    for label, test, again in shown:
        defect = {True: "yes", False: "no"}.get(test.defect, "-")
        lines.append(f"| {label} | {test.verdict} | {seconds_cell(test.step_s)} | "
                     f"{cost_text(test.expected_step_s, test.cost_ratio)} | {defect} | "
                     f"{'yes' if again else 'no'} | {test.trial} |")
    if b.minimal is not None:
        lines += ["", f"Minimal failing change set: **{knob_text(b.minimal)}** (trial "
                      f"`{b.minimal_trial}`)" + (": the failure needs no change from the "
                                                 "baseline" if not b.minimal else "") + "."]
    return lines


def _results_section(state: TriageState, result: TriageResult, run_dir: Path) -> list[str]:
    lines = ["### Correctness checks", ""] + _checks_section(state, result)
    lines += ["", "### Layer threshold", ""] + _threshold_section(state, result, run_dir)
    lines += ["", "### Efficiency against a dense reference", ""] + _efficiency_section(state)
    conf = state.repeats.confidence if state.repeats else None
    if conf:
        lines += ["", "### Repeats of the failing configuration", "",
                  f"Verdicts: {', '.join(conf.verdicts)} — **{conf.verdict}** in "
                  f"{conf.text()} runs" + (" (flaky)." if conf.flaky else ".")]
    return (lines + _attribution_section(state) + _branches_section(state, result)
            + _bisection_section(state))


def _regression_section(regression: dict[str, Any]) -> list[str]:
    lines = [f"Baseline: `{regression['path']}`; threshold +{100 * regression['threshold']:.0f}%"
             f" in step time or peak RSS.", ""]
    deltas = regression["deltas"]
    if not deltas:
        return lines + ["No OK trial of this run matches an OK trial of the baseline."]
    lines += ["| run | layers | quantity | baseline | now | change | regression |",
              "|---|---|---|---|---|---|---|"]
    for d in deltas:
        unit = bytes_cell if d["quantity"] == "peak_rss" else seconds_cell
        lines.append(f"| {d['label'] or '-'} | {d['n_layers']} | {d['quantity']} | "
                     f"{unit(d['before'])} | {unit(d['after'])} | {d['change']:+.0%} | "
                     f"{'**yes**' if d['regressed'] else 'no'}"
                     + (f" (against its expected cost {d['cost_change']:+.0%}: the machine "
                        f"slowed, not the code)" if d.get("explained") else "") + " |")
    return lines


def _reproduction(state: TriageState, result: TriageResult) -> list[str]:
    if result.reproduction is None and result.failure:
        return [f"No recorded trial of this run ended {result.failure.verdict}, so no "
                f"configuration is named; the command that produced this report:", "", "```",
                shlex.join(state.argv), "```"]
    if result.reproduction is None:
        return ["Nothing failed; the command that produced this report:", "", "```",
                shlex.join(state.argv), "```"]
    what = ("The failing check alone:" if result.failure and result.failure.check
            else "The smallest failing configuration of this run:")
    return [what, "", "```", shlex.join(result.reproduction), "```", "",
            "The triage itself, to rerun or resume:", "", "```", shlex.join(state.argv), "```"]


def _check_row(check: CheckResult, result: TriageResult) -> dict[str, Any]:
    """A check as summary.json lists it: its shown status and the module it names."""
    return {"name": check.name, "passed": check.passed,
            "module": result.check_module[check.name], "summary": check.summary,
            "verdict": result.check_status[check.name]}


def build_triage_report(run_dir: Path, state: TriageState, records: dict[str, TrialRecord],
                        result: TriageResult) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a triage run directory's state, its trials by trial
    directory name, and ``result``: the finding the triage kept (decided as it ended) and
    what was measured beside it (nsadiag.triage.finding.measure_triage); writes sweep.png
    and flame.png into run_dir."""
    finding = result.finding
    report = Report.of(finding, summary_note=[f"Machine: {result.machine_text}."]
                       if result.machine_text else [])
    report.add("Environment", _env_section(state))
    report.add("Configuration comparison", _config_section(result, records))
    report.add("Systematic results", _results_section(state, result, run_dir))
    failing = records.get(result.failure.trial or "") if result.failure else None
    if failing is not None:
        repeats = [records[r.trial] for r in (state.repeats.runs if state.repeats else ())
                   if r.trial in records and records[r.trial] is not failing]
        report.add("Evidence", evidence_section(failing) +
                   flame_section(failing, finding, run_dir, also=repeats))
    else:
        report.add("Evidence", ["No failing trial: the evidence of every trial is in its "
                                "`trial-<n>/evidence.json`."])
    cause = report.add("Root cause", cause_section(finding)).body
    if result.separately:
        cause += ["", "Found separately by the correctness checks (a defect of its own, not "
                      "a cause of the failure above):", ""] + items(result.separately)
    report.add("Minimal reproduction", _reproduction(state, result))
    report.add("Recommendations", recommendations(finding))
    if result.regression:
        report.add("Regression against the baseline",
                   _regression_section(result.regression))
    report.add("Time", [time_text(state, result.not_reached)])
    regression = result.regression
    failed_check = next((c for c in (state.checks.results if state.checks else [])
                         if result.failure and c.name == result.failure.check), None)
    summary = Summary(
        command="triage", headline=finding.headline, status=finding.status,
        verdicts=[verdict_row(r.label, r.verdict, r.n_layers, r.seq_len, r.slow_by)
                  for r in result.rows],
        rows=[r.to_dict() for r in result.rows],
        failing=(failing.verdict.to_dict() if failing is not None else
                 failed_check.verdict.to_dict() if failed_check is not None else None),
        details={"finding": finding.to_dict(), "target": state.target,
                 "complete": not state.stopped, "stopped": state.stopped,
                 "threshold": state.sweep.threshold if state.sweep else None,
                 "deepest_ok": state.sweep.deepest_ok if state.sweep else None,
                 "failure": result.failure.to_dict() if result.failure else None,
                 "checks": [_check_row(c, result) for c in
                            (state.checks.results if state.checks else [])],
                 "env_problems": state.env_problems, "machine": result.machine,
                 "efficiency": result.efficiency.to_dict() if result.efficiency else None,
                 "regression": ({"baseline": regression["path"],
                                 "threshold": regression["threshold"],
                                 "regressions": regression["regressed"]}
                                if regression else None),
                 "elapsed_s": state.elapsed_s, "baseline_knobs": dict(BASELINE)})
    return report.markdown(), summary.to_dict()
