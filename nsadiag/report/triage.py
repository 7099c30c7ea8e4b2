"""The triage report: Markdown and summary.json from triage.json and the stored trials.

The shape is the hand-written hang reports' (executive summary, configuration comparison,
systematic results, evidence, root cause with what is ruled out and what is implicated,
minimal reproduction, recommendations); every sentence quotes a trial or a measurement.
The state is the run directory's triage.json (nsadiag.triage.engine), the trials its
trials.jsonl; nsadiag.report.dispatch writes what ``build_triage_report`` returns.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from nsadiag.ci import EXIT_FAILURE, EXIT_HEALTHY, EXIT_INCONCLUSIVE, EXIT_REGRESSION
from nsadiag.compare import compare_rows, regressions
from nsadiag.evidence import StackSample
from nsadiag.probes.frames import hot_frame, user_frame
from nsadiag.probes.profile import describe as describe_profile
from nsadiag.report.markdown import (
    RECOMMENDATIONS,
    cli_value,
    evidence_section,
    fmt_bytes,
    fmt_s,
    reproduction,
    results_table,
)
from nsadiag.report.summary import STATUS_OF_EXIT, Summary, verdict_row
from nsadiag.rundir import TrialRecord, load_records
from nsadiag.sweep import SweepRow, row_from_record
from nsadiag.triage.decide import BASELINE
from nsadiag.trials import triage_labels
from nsadiag.verdict.load import machine_sentence, worst_contention

KNOB_ADVICE = {
    "grad_ckpt": "gradient checkpointing is needed for the failure: compare gradients with "
                 "and without it (`nsadiag check ckpt`) and check what the recompute closes "
                 "over",
    "dtype": "the failure needs the lower precision: look for overflow, dtype casts and "
             "autocast regions in the implicated module",
    "backend": "the failure follows the attention backend: run `nsadiag check parity` and "
               "compare the backends' memory (`nsadiag memory --backend ...`)",
    "branches": "the failure follows the set of computed branches: see the branch isolation "
                "table",
    "seq_len": "the failure needs the long sequence: the cost grows with sequence length "
               "(per-token work, O(S^2) masks or buffers); measure it with `nsadiag memory` "
               "at two lengths",
    "world_size": "the failure needs several processes: run `nsadiag ddp` and compare the "
                  "ranks' collectives",
}


WRONG_ADVICE = ("A correctness check failed: the module it names computes something else than "
                "its reference; rerun `nsadiag check` on the minimal configuration after a fix.")


def _records(run_dir: Path) -> dict[str, TrialRecord]:
    return {Path(r.trial_dir).name: r for r in load_records(run_dir / "trials.jsonl")}


def _row(records: dict[str, TrialRecord], trial: str, label: str) -> SweepRow | None:
    record = records.get(trial)
    return row_from_record(record, label) if record else None


def _rows(state: dict[str, Any], records: dict[str, TrialRecord]) -> list[SweepRow]:
    """Every trial of the triage once, labelled by the stage that ran it."""
    rows = [_row(records, trial, label) for trial, label in triage_labels(state).items()]
    return [row for row in rows if row is not None]


def _samples(records: list[TrialRecord]) -> list[StackSample]:
    return [StackSample.from_dict(sample) for record in records
            for sample in ((record.evidence.get("stall") or {}).get("samples") or [])]


def _frames(state: dict[str, Any], records: dict[str, TrialRecord]) -> dict[str, Any]:
    """The hot frame and the hot frame in the user's code over every run of the failing
    configuration (the first run and its repeats)."""
    runs = [records[r["trial"]] for r in state.get("repeats", {}).get("runs", [])
            if r["trial"] in records]
    samples = _samples(runs)
    found: dict[str, Any] = {"samples": len(samples), "hot_frame": None, "user_frame": None}
    hot = hot_frame(samples)
    if hot:
        found["hot_frame"] = f"{hot[0].where()}" + (f" `{hot[0].code}`" if hot[0].code else "")
        found["hot_count"] = hot[1]
    own = user_frame(samples)
    if own:
        found["user_frame"] = f"{own[0].where()}" + (f" `{own[0].code}`" if own[0].code else "")
        found["user_count"] = own[1]
    profiled = next((run.evidence["profile"] for run in runs if run.evidence.get("profile")),
                    None)
    found["profile"] = describe_profile(profiled) if profiled else []
    line = ((profiled or {}).get("hot_lines") or [None])[0]
    if line is not None:  # hundreds of samples over the run outrank a few at the kill
        found.update(hot_frame=line["where"] + (f" `{line['code']}`" if line.get("code")
                                                else ""),
                     hot_count=line["count"], samples=profiled["samples"],
                     hot_share=line["fraction"])
    found["slow_by"] = next((reason for run in runs for reason in run.verdict["reasons"]
                             if reason.startswith("slow by ")), None)
    return found


def _efficiency_ref(state: dict[str, Any]) -> dict[str, Any] | None:
    """The sweep trial whose efficiency the summary quotes: the failing one, else the
    deepest probed one that measured it."""
    sweep = state.get("sweep") or {}
    measured = [r for r in sweep.get("probed") or [] if r.get("efficiency") is not None]
    failing = (sweep.get("failing") or {}).get("trial")
    chosen = next((r for r in measured if r["trial"] == failing), None)
    return chosen or max(measured, key=lambda r: r["n_layers"] or 0, default=None)


def _efficiency_sentence(ref: dict[str, Any] | None) -> str | None:
    if not ref or ref.get("dense_efficiency") is None:
        return None
    cost = (f"; a step took {ref['cost_ratio']:.1f}x its expected cost (the dense "
            f"reference's time for its FLOPs)" if ref.get("cost_ratio") is not None else "")
    return (f"Efficiency of trial `{ref['trial']}` ({ref['n_layers']} layer(s)): "
            f"{ref['efficiency']:.2%} of this machine's matmul rate, beside "
            f"{ref['dense_efficiency']:.1%} for a dense reference (a plain SDPA transformer "
            f"block of the target's batch, sequence length and width, timed in the same "
            f"trial){cost}.")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _efficiency_section(state: dict[str, Any]) -> list[str]:
    refs = [r for r in (state.get("sweep") or {}).get("probed") or []
            if r.get("dense_efficiency") is not None]
    if not refs:
        return ["No trial measured its FLOPs against the dense reference."]
    lines = ["Every trial times a dense reference on this machine: a plain transformer block "
             "(SDPA attention, a 4x MLP) of the target's batch, sequence length and width. "
             "A step's expected cost is that block's time for the step's FLOPs; the matmul "
             "rate cancels out of the ratio.", "",
             "| trial | layers | verdict | step s | median of | expected s | vs expected | "
             "efficiency | dense reference | defect counted |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in refs:
        ratio = f"{r['cost_ratio']:.1f}x" if r.get("cost_ratio") is not None else "-"
        defect = {True: "yes", False: "no"}.get(r.get("defect"), "-")
        lines.append(f"| {r['trial']} | {r['n_layers']} | {r['verdict']} | "
                     f"{fmt_s(r.get('step_s'))} | {r.get('timed_steps', '-')} | "
                     f"{_seconds(r.get('expected_step_s'))} | {ratio} | "
                     f"{r['efficiency']:.2%} | "
                     f"{r['dense_efficiency']:.1%} | {defect} |")
    return lines


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _share_text(seconds: float, span: float) -> str:
    return f"{100 * seconds / span:.0f}%" if span > 0 else "-"


def _span_text(attribution: dict[str, Any], events: str = "; {} of {} heartbeat events"
               ) -> str:
    """What the attribution's seconds are shares of: the training time, or its last part
    when the evidence kept only the most recent heartbeat events (``events`` says so)."""
    span, kept = attribution["span_s"], attribution.get("events")
    total = attribution.get("events_total")
    if kept is None or total is None or total <= kept:
        return f"the {span:.1f} s of training"
    return f"the last {span:.1f} s of training" + events.format(f"the {kept:,} most recent",
                                                               f"{total:,}")


def _hot_module(state: dict[str, Any]) -> dict[str, Any] | None:
    patterns = (state.get("attribution") or {}).get("by_pattern") or []
    return patterns[0] if patterns else None


def _implicated_branches(state: dict[str, Any], verdict: str) -> tuple[list[str], list[str]]:
    runs = (state.get("branches") or {}).get("runs") or []
    bad = [r["branch"] for r in runs if r["verdict"] == verdict]
    good = [r["branch"] for r in runs if r["verdict"] == "OK"]
    return bad, good


def _knob_text(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "none"


def _minimal_spec(state: dict[str, Any], records: dict[str, TrialRecord]) -> TrialRecord | None:
    bisection = state.get("bisection") or {}
    trial = bisection.get("minimal_trial") or (state.get("sweep", {}).get("failing") or {}
                                               ).get("trial")
    return records.get(trial) if trial else None


def _headline(state: dict[str, Any], failure: dict[str, Any] | None) -> str:
    if failure and failure.get("check"):
        where = f" in {failure['module']}" if failure["module"] else ""
        return f"{failure['verdict']}: the {failure['check']} check fails{where}"
    if failure:
        text = f"{failure['verdict']} at {failure['n_layers']} layer(s)"
        if failure.get("module"):
            text += f" in {failure['module']}"
        if failure.get("minimal"):
            text += f"; minimal failing change: {_knob_text(failure['minimal'])}"
        elif failure.get("minimal") == {}:
            text += ("; the defect shows at the healthy baseline's knobs too"
                     if failure["verdict"] == "SLOW" else
                     "; fails at the healthy baseline's knobs too")
        return text
    unreproduced = _unreproduced(state)
    if unreproduced:
        return _unreproduced_text(unreproduced)
    sweep = state.get("sweep") or {}
    deepest = sweep.get("deepest_ok")
    big = sweep.get("slow_by_size") or []
    size = (f"; slow by size from {big[0]} layer(s): the work outlasts the budget, done "
            f"without a defect" if big else "")
    if not sweep.get("complete"):
        fine = "no defect" if big else "OK"
        return (f"no failure found before the triage stopped ({fine} up to {deepest or 0} "
                f"layer(s){size})")
    return (f"healthy: no defect up to {deepest} layer(s){size}" if big else
            f"healthy: OK up to {deepest} layer(s)")


UNDECIDED_CHECKS = ("SLOW", "INCONCLUSIVE")
"""A check cut short by its time budget is reported as not finished and decides nothing
(nsadiag.checks: ``failed`` is false; records without that field: these verdicts); every
other non-OK check verdict (WRONG, ERROR, CRASH, OOM, a stall) is a failure."""


def _check_failed(check: dict[str, Any]) -> bool:
    return check.get("failed", check["verdict"]["name"] not in ("OK", *UNDECIDED_CHECKS))


def _failed_checks(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in (state.get("checks") or {}).get("results", []) if _check_failed(c)]


def _unreproduced(state: dict[str, Any]) -> dict[str, Any] | None:
    """The sweep's timing verdict that its repeats did not confirm (see the engine's
    repeats stage): the verdict, the depth and every run's verdict; None otherwise."""
    repeats = state.get("repeats") or {}
    failing = (state.get("sweep") or {}).get("failing")
    if repeats.get("reproduced") is not False or not failing:
        return None
    return {"verdict": failing["verdict"], "n_layers": failing["n_layers"],
            "trial": failing["trial"], "verdicts": repeats["confidence"]["verdicts"]}


def _unreproduced_text(found: dict[str, Any]) -> str:
    verdicts = found["verdicts"]
    same = sum(v == found["verdict"] for v in verdicts)
    return (f"inconclusive: {found['verdict']} at {found['n_layers']} layer(s) in {same} of "
            f"{len(verdicts)} runs ({', '.join(verdicts)}), not reproduced: a timing verdict "
            f"the repeats do not confirm (a loaded machine, or a run close to its budget)")


def _failure(state: dict[str, Any], frames: dict[str, Any]) -> dict[str, Any] | None:
    """The finding: the sweep's failing trial (when its repeats reproduced it), else the
    first failed check; None if healthy or inconclusive."""
    failing = (state.get("sweep") or {}).get("failing")
    if _unreproduced(state):
        failing = None
    failed = _failed_checks(state)
    if not failing and failed:
        check = failed[0]
        return {"verdict": check["verdict"]["name"], "n_layers": state["checks"]["n_layers"],
                "trial": None,
                "check": check["name"], "reason": check["summary"], "confidence": None,
                "module": check["module"], "branches": [], "hot_frame": None,
                "user_frame": None, "minimal": None, "minimal_trial": None}
    if not failing:
        return None
    hot = _hot_module(state)
    bad_branches, _ = _implicated_branches(state, failing["verdict"])
    conf = (state.get("repeats") or {}).get("confidence")
    bisection = state.get("bisection") or {}
    return {"verdict": failing["verdict"], "n_layers": failing["n_layers"],
            "trial": failing["trial"], "reason": failing["reason"],
            "confidence": conf,
            "module": f"{hot['module']} {hot['phase']}" if hot else None,
            "branches": bad_branches, "hot_frame": frames.get("hot_frame"),
            "user_frame": frames.get("user_frame"),
            "minimal": bisection.get("minimal"),
            "minimal_trial": bisection.get("minimal_trial")}


# ---- sections -----------------------------------------------------------------------------


def _summary_section(state, failure, frames, regressed) -> list[str]:
    lines = []
    for check in _failed_checks(state):
        names = f" names `{check['module']}`" if check["module"] else ""
        lines.append(f"**{check['verdict']['name']}**: the {check['name']} check{names}: "
                     f"{check['summary']}.")
    if failure and not failure.get("check"):
        conf = failure["confidence"]
        same = sum(v == failure["verdict"] for v in conf["verdicts"]) if conf else 0
        sure = f" in {same} of {conf['total']} runs" if conf else ""
        lines.append(f"The target fails at **{failure['n_layers']} layer(s)** with "
                     f"**{failure['verdict']}**{sure}: {failure['reason']}.")
        deepest = state["sweep"].get("deepest_ok")
        lines.append(f"{deepest} layer(s) are OK." if deepest else
                     "Even one layer fails.")
        if conf and conf["total"] > 1 and conf["agreeing"] < conf["total"]:
            lines.append(f"The verdict is flaky: the runs gave {', '.join(conf['verdicts'])}.")
        hot = _hot_module(state)
        if hot:
            span = state["attribution"]["span_s"]
            lines.append(f"Time goes to `{hot['module']}` in {hot['phase']} "
                         f"({hot['seconds']:.1f} s, {_share_text(hot['seconds'], span)} of "
                         f"{_span_text(state['attribution'])}).")
        if failure["branches"]:
            lines.append(f"Branch isolation: the {', '.join(failure['branches'])} branch "
                         f"alone reproduces {failure['verdict']}.")
        if frames.get("hot_frame"):
            share = (f" in {frames['hot_share']:.0%} of {frames['samples']} sampled stacks"
                     if frames.get("hot_share") is not None else "")
            lines.append(f"Hot frame: {frames['hot_frame']}{share}.")
        if frames.get("user_frame") and frames["user_frame"] != frames.get("hot_frame"):
            lines.append(f"Hottest frame in the target's own code: {frames['user_frame']}.")
        if frames.get("slow_by"):
            lines.append(_sentence(frames["slow_by"]) + ".")
        efficiency = _efficiency_sentence(_efficiency_ref(state))
        if efficiency:
            lines.append(efficiency)
        lines += [_sentence(sentence) + "." for sentence in frames.get("profile", [])]
        if failure["minimal"] is not None:
            lines.append(("The failure needs only " + _knob_text(failure["minimal"]) +
                          " on top of the healthy baseline.") if failure["minimal"] else
                         ("The defect shows with every knob at the healthy baseline (its "
                          "work, not whether its steps fitted a budget)."
                          if failure["verdict"] == "SLOW" else
                          "The failure reproduces with every knob at the healthy baseline."))
    elif _unreproduced(state):
        lines.append(_sentence(_headline(state, None)) + ". Rerun on a quieter machine or "
                     "with a larger `--budget` to settle it; the runs' evidence is in their "
                     "`trial-<n>/evidence.json`.")
    elif not failure and (state.get("sweep") or {}).get("slow_by_size"):
        lines.append(_sentence(_headline(state, None)) + ". No trial failed: the SLOW ones did "
                     "the model's work without a host read per token or a loop of tiny ops, "
                     "at the machine's pace; a longer `--budget` or fewer `--steps` lets "
                     "them finish (their evidence gives FLOPs, efficiency and the ETA).")
        efficiency = _efficiency_sentence(_efficiency_ref(state))
        if efficiency:
            lines.append(efficiency)
    elif not failure:
        lines.append(_sentence(_headline(state, None)) + ": no trial ended other than OK.")
    if failure and failure["verdict"] == "SLOW" and \
            state["trial_budget_s"] < state["user_budget_s"]:
        lines.append(f"The time limit lowered each trial's budget from "
                     f"{state['user_budget_s']:g} s to {state['trial_budget_s']:.0f} s: SLOW "
                     f"here means not finished within {state['trial_budget_s']:.0f} s (see the "
                     f"ETA).")
    if failure and failure.get("check"):
        lines.append(_headline({**state, "sweep": state.get("sweep") or {}}, None)
                     .replace("healthy: ", "The layer sweep: ") + ".")
    if regressed:
        lines.append(f"**Regression** against the baseline: {len(regressed)} measurement(s) "
                     f"worse than the threshold.")
    if state.get("stopped"):
        lines.append(f"**Incomplete:** {state['stopped']}; the stages not reached are "
                     f"listed under Time.")
    return [" ".join(lines)]


def _env_section(state) -> list[str]:
    env = state.get("env") or {}
    if not env:
        return ["The environment was not recorded."]
    lines = ["| item | value |", "|---|---|",
             f"| python | {env.get('python')} |",
             f"| torch | {(env.get('packages') or {}).get('torch')} |",
             f"| platform | {env.get('platform')} |",
             f"| CPUs / torch threads | {env.get('cpu_count')} / {env.get('torch_threads')} |",
             f"| CUDA | {env.get('cuda')} |", f"| py-spy | {env.get('py_spy')} |",
             f"| ptrace | {env.get('ptrace')} |"]
    problems = state.get("env_problems") or []
    lines += ["", "Problems: " + ("; ".join(problems) if problems else "none found.")]
    return lines


def _checks_section(state) -> list[str]:
    checks = state.get("checks") or {}
    if checks.get("skipped"):
        return [f"Skipped ({checks['skipped']})."]
    results = checks.get("results") or []
    if not results:
        return ["No check ran."]
    lines = [f"At {checks['n_layers']} layer(s):", "",
             "| check | verdict | module | finding |", "|---|---|---|---|"]
    for c in results:
        lines.append(f"| {c['name']} | {c.get('status', c['verdict']['name'])} | "
                     f"{c['module'] or '-'} | {c['summary']} |")
    unfinished = [f"{c['name']} ({c['verdict']['name']})" for c in results
                  if c["verdict"]["name"] != "OK" and not _check_failed(c)]
    if unfinished:
        lines += ["", f"Did not finish, so neither passed nor failed: {', '.join(unfinished)}; "
                      f"the check's directory under checks/ holds its evidence."]
    return lines


def _config_section(state, records) -> list[str]:
    sweep = state.get("sweep") or {}
    columns: list[tuple[str, TrialRecord]] = []
    by_depth = {r["n_layers"]: r["trial"] for r in sweep.get("probed", [])}
    if sweep.get("deepest_ok") in by_depth:
        columns.append(("healthy (deepest OK)", records.get(by_depth[sweep["deepest_ok"]])))
    if sweep.get("failing"):
        columns.append(("failing", records.get(sweep["failing"]["trial"])))
    minimal = (state.get("bisection") or {}).get("minimal_trial")
    if minimal and minimal != (sweep.get("failing") or {}).get("trial"):
        columns.append(("minimal failing", records.get(minimal)))
    columns = [(name, record) for name, record in columns if record is not None]
    if not columns:
        return ["No trial finished."]
    fields = ["target", "n_layers", "seq_len", "batch", "dtype", "grad_ckpt", "branches",
              "backend", "world_size", "device", "steps", "budget_s", "overrides"]
    lines = ["| field | " + " | ".join(name for name, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for key in fields:
        values = [r.spec.get(key, 1 if key == "world_size" else None) for _, r in columns]
        lines.append(f"| {key} | " + " | ".join(str(v) for v in values) + " |")
    # a bisection test reproduces a slowness by its work, whatever its verdict: say so
    counted = [records.get(t["trial"]) for t in
               (state.get("bisection") or {}).get("tests") or [] if t.get("defect")]
    lines.append("| **verdict** | " + " | ".join(
        f"**{r.verdict_name}**" + (" (defect counted)" if any(r is c for c in counted) and
                                   r.verdict_name != "SLOW" else "")
        for _, r in columns) + " |")
    return lines


def _results_section(state, records, rows) -> list[str]:
    lines = ["### Correctness checks", ""] + _checks_section(state)
    lines += ["", "### Layer threshold", ""]
    sweep = state.get("sweep") or {}
    probed = sweep.get("probed") or []
    if probed:
        lines.append("Probed in this order (doubling, then bisecting): " + ", ".join(
            f"{r['n_layers']} → {r['verdict']}" for r in probed) + ".")
    if sweep.get("threshold"):
        lines.append(f"Threshold: **{sweep['threshold']} layer(s)** "
                     f"(deepest OK: {sweep.get('deepest_ok') or 'none'}).")
    elif sweep.get("complete"):
        lines.append(f"Every probed depth up to {state['max_layers']} layer(s) is OK.")
    lines += ["", "All trials:", ""] + results_table(rows)
    lines += ["", "### Efficiency against a dense reference", ""] + _efficiency_section(state)
    repeats = state.get("repeats") or {}
    if repeats.get("confidence"):
        conf = repeats["confidence"]
        lines += ["", "### Repeats of the failing configuration", "",
                  f"Verdicts: {', '.join(conf['verdicts'])} — **{conf['verdict']}** in "
                  f"{conf['agreeing']} of {conf['total']} runs"
                  + (" (flaky)." if conf["flaky"] else ".")]
    attribution = state.get("attribution") or {}
    if attribution.get("by_pattern"):
        span = attribution["span_s"]
        lines += ["", f"### Where the time goes (trial `{attribution['trial']}`, "
                      f"{_span_text(attribution, ': {} of {} heartbeat events')})", "",
                  "| module (all layers) | phase | seconds | share | still open at the end |",
                  "|---|---|---|---|---|"]
        for t in attribution["by_pattern"]:
            lines.append(f"| {t['module']} | {t['phase']} | {t['seconds']:.2f} | "
                         f"{_share_text(t['seconds'], span)} | {t['open']} |")
    branches = state.get("branches") or {}
    if branches.get("skipped"):
        lines += ["", "### Branch isolation", "", f"Skipped: {branches['skipped']}."]
    elif branches.get("runs"):
        lines += ["", f"### Branch isolation ({branches['n_layers']} layer(s), one branch "
                      f"computed)", "", "| branch | verdict | step s | peak RSS | trial |",
                  "|---|---|---|---|---|"]
        for ref in branches["runs"]:
            row = _row(records, ref["trial"], "")
            lines.append(f"| {ref['branch']} | {ref['verdict']} | "
                         f"{fmt_s(row.step_s if row else None)} | "
                         f"{fmt_bytes(row.peak_rss if row else None)} | {ref['trial']} |")
    bisection = state.get("bisection")
    if bisection:
        lines += ["", "### Knob bisection (delta debugging towards the healthy baseline)", "",
                  f"Changes against the baseline: {_knob_text(bisection['changes'])} "
                  f"(baseline: {_knob_text(bisection['baseline'])}). A test applies some "
                  f"changes to the baseline at {bisection['n_layers']} layer(s) and "
                  + ("reproduces the failure when its work shows the defect: the counts of "
                     "its first forward say so, or its time per step is far above its "
                     "expected cost, whatever its verdict (not whether its steps fitted "
                     "the budget)." if bisection["verdict"] == "SLOW" else
                     f"fails when it ends {bisection['verdict']}."), ""]
        if not bisection["changes"]:
            lines.append("No knob differs from the baseline: nothing to bisect.")
        else:
            lines += ["| changes applied | verdict | step s | vs expected cost | defect "
                      "counted | reproduces | trial |", "|---|---|---|---|---|---|---|"]
            failing_ref = state["sweep"]["failing"]
            for label, test in [(f"all ({', '.join(bisection['changes'])})",
                                 {**failing_ref, "reproduces": True}),
                                *[(", ".join(t["applied"]) or "none (baseline)", t)
                                  for t in bisection["tests"]]]:
                ratio = (f"{test['cost_ratio']:.1f}x" if test.get("cost_ratio") is not None
                         else "-")
                defect = {True: "yes", False: "no"}.get(test.get("defect"), "-")
                again = {True: "yes", False: "no"}.get(
                    test.get("reproduces", test["verdict"] == bisection["verdict"]))
                lines.append(f"| {label} | {test['verdict']} | {fmt_s(test.get('step_s'))} | "
                             f"{ratio} | {defect} | {again} | {test['trial']} |")
        if bisection.get("minimal") is not None:
            lines += ["", f"Minimal failing change set: **{_knob_text(bisection['minimal'])}**"
                          f" (trial `{bisection['minimal_trial']}`)."]
    return lines


def _root_cause(state, records, failure, frames) -> list[str]:
    ruled_out, implicated, separately = [], [], []
    sweep = state.get("sweep") or {}
    by_trial = {r["trial"]: r for r in sweep.get("probed", [])}
    ok = [r for r in by_trial.values() if r["verdict"] == "OK"]
    if ok:
        deepest = max(ok, key=lambda r: r["n_layers"])
        ruled_out.append(f"A failure at {deepest['n_layers']} layer(s) or fewer with this "
                         f"configuration: trial `{deepest['trial']}` is OK.")
    for check in (state.get("checks") or {}).get("results", []):
        if check["verdict"]["name"] == "OK" and not check["summary"].startswith(
                "not applicable"):
            ruled_out.append(f"Wrong results of the kind the {check['name']} check looks "
                             f"for: {check['summary']}.")
        elif _check_failed(check):
            found = (f"`{check['module'] or check['name']}` ({check['name']} check, "
                     f"{check['verdict']['name']}): {check['summary']}.")
            # a wrong result is not the cause of a slowness or stall measured without it
            (separately if failure and not failure.get("check") else implicated).append(found)
    if failure and not failure.get("check"):
        verdict = failure["verdict"]
        implicated.append(f"Depth: {failure['n_layers']} layer(s) end as {verdict} (trial "
                          f"`{failure['trial']}`).")
        if verdict == "SLOW":
            ruled_out.append("A hang: it was still progressing (heartbeats or sampler "
                             "pulses) when the budget ran out.")
        bad, good = _implicated_branches(state, verdict)
        if bad:
            implicated.append(f"Branch(es) {', '.join(bad)}: alone they end {verdict}.")
        if good:
            ruled_out.append(f"Branch(es) {', '.join(good)}: alone they are OK.")
        hot = _hot_module(state)
        if hot:
            span = state["attribution"]["span_s"]
            implicated.append(f"`{hot['module']}` {hot['phase']}: "
                              f"{_share_text(hot['seconds'], span)} of the failing trial's "
                              f"time.")
        if frames.get("hot_frame"):
            implicated.append(f"Hot frame {frames['hot_frame']} ({frames.get('hot_count')} of "
                              f"{frames['samples']} stack samples of the failing runs).")
        if frames.get("user_frame") and frames["user_frame"] != frames.get("hot_frame"):
            implicated.append(f"In the target's code: {frames['user_frame']}.")
        bisection = state.get("bisection") or {}
        minimal = bisection.get("minimal")
        if minimal is not None:
            tests = {tuple(t["applied"]): t for t in bisection["tests"]}
            for knob, value in bisection["changes"].items():
                base = bisection["baseline"][knob]
                if knob not in minimal:
                    ruled_out.append(f"{knob}={value}: the failure reproduces with {knob}={base} "
                                     f"(trial `{bisection['minimal_trial']}`).")
                    continue
                without = tuple(k for k in minimal if k != knob)
                test = tests.get(without)
                shown = (", its work shows no defect" if test and test.get("reproduces") is
                         False and test["verdict"] == bisection["verdict"] else "")
                evidence = (f" (trial `{test['trial']}`: {test['verdict']}{shown})" if test
                            else "")
                implicated.append(f"{knob}={value}: with {knob}={base} instead, the failure "
                                  f"goes away{evidence}.")
    elif not failure:
        implicated.append("Nothing: no trial ended other than OK.")
    lines = (["The issue is NOT caused by:", ""] + [f"- {x}" for x in ruled_out or ["(nothing "
             "ruled out yet)"]] + ["", "The issue IS tied to:", ""] +
             [f"- {x}" for x in implicated])
    if separately:
        lines += ["", "Found separately by the correctness checks (a defect of its own, not a "
                      "cause of the failure above):", ""] + [f"- {x}" for x in separately]
    return lines


def _check_reproduction(state, failure) -> list[str]:
    """The failing check alone, with the triage's trial options that `nsadiag check` takes."""
    spec = state.get("base_spec") or {}
    command = ["nsadiag", "check", failure["check"], "--target", spec.get("target", "nsa"),
               "--layers", str(failure["n_layers"]), "--seq-len", str(spec.get("seq_len")),
               "--batch", str(spec.get("batch")), "--device", str(spec.get("device")),
               "--stall-timeout", f"{spec.get('stall_timeout_s', 60):g}",
               "--seed", str(spec.get("seed", 0))]
    if spec.get("backend"):
        command += ["--backend", spec["backend"]]
    if failure["check"] == "ddp":
        command += ["--world-size", str(state.get("world_size", 2))]
    for key, value in sorted((spec.get("overrides") or {}).items()):
        command += ["--set", f"{key}={cli_value(value)}"]
    return ["The failing check alone:", "", "```", shlex.join(command), "```"]


def _recommendations(state, failure) -> list[str]:
    if not failure:
        return ["Healthy at every tested depth. If the full run still stops, triage its own "
                "configuration (sequence length, dtype, world size) with a larger "
                "--max-layers."]
    lines = [f"1. {RECOMMENDATIONS.get(failure['verdict'], WRONG_ADVICE)}"]
    for knob in failure.get("minimal") or {}:
        lines.append(f"{len(lines) + 1}. {_sentence(KNOB_ADVICE[knob])}.")
    if failure.get("user_frame"):
        lines.append(f"{len(lines) + 1}. Start reading at {failure['user_frame']}.")
    if failure.get("confidence") and failure["confidence"]["flaky"]:
        lines.append(f"{len(lines) + 1}. The verdict is flaky: rerun the minimal reproduction "
                     f"several times before and after a fix.")
    return lines


def _regression_section(regression) -> list[str]:
    lines = [f"Baseline: `{regression['path']}`; threshold +{100 * regression['threshold']:.0f}%"
             f" in step time or peak RSS.", ""]
    deltas = regression["deltas"]
    if not deltas:
        return lines + ["No OK trial of this run matches an OK trial of the baseline."]
    lines += ["| run | layers | quantity | baseline | now | change | regression |",
              "|---|---|---|---|---|---|---|"]
    for d in deltas:
        unit = fmt_bytes if d["quantity"] == "peak_rss" else fmt_s
        lines.append(f"| {d['label'] or '-'} | {d['n_layers']} | {d['quantity']} | "
                     f"{unit(d['before'])} | {unit(d['after'])} | {d['change']:+.0%} | "
                     f"{'**yes**' if d['regressed'] else 'no'}"
                     + (f" (against its expected cost {d['cost_change']:+.0%}: the machine "
                        f"slowed, not the code)" if d.get("explained") else "") + " |")
    return lines


def _time_section(state) -> list[str]:
    stages = ["env", "checks", "sweep", "repeats", "attribution", "branches", "bisection"]
    missing = [s for s in stages if s not in state.get("stages_done", [])]
    lines = [f"Limit {state['max_minutes']:g} min; used {state.get('elapsed_s', 0):.0f} s. "
             f"Trial budget {state['trial_budget_s']:.0f} s (asked: "
             f"{state['user_budget_s']:g} s)."]
    if state.get("stopped"):
        lines.append(f"{_sentence(state['stopped'])}. Not reached: "
                     f"{', '.join(missing) or 'nothing'}. Rerun with the same --out to resume.")
    return [" ".join(lines)]


def build_triage_report(run_dir: Path, state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a triage run directory's state and trials."""
    records = _records(run_dir)
    rows = _rows(state, records)
    frames = _frames(state, records)
    failure = _failure(state, frames)
    regression = state.get("regression")
    regressed = []
    if regression:
        regression["deltas"] = [d.to_dict() for d in compare_rows(
            regression["rows"], [r.to_dict() for r in rows], regression["threshold"])]
        regressed = regressions(regression["deltas"])
    headline = _headline(state, failure)
    md = [f"# nsadiag triage: {headline}", "", f"Target `{state['target']}`.", "",
          "## Executive summary", ""] + _summary_section(state, failure, frames, regressed)
    machine = worst_contention(r.evidence.get("load") for r in records.values())
    if machine:
        md += ["", f"Machine: {machine_sentence(machine)}."]
    md += ["", "## Environment", ""] + _env_section(state)
    md += ["", "## Configuration comparison", ""] + _config_section(state, records)
    md += ["", "## Systematic results", ""] + _results_section(state, records, rows)
    failing_record = records.get(failure["trial"]) if failure and failure["trial"] else None
    md += ["", "## Evidence", ""]
    md += evidence_section(failing_record) if failing_record else [
        "No failing trial: the evidence of every trial is in its `trial-<n>/evidence.json`."]
    md += ["", "## Root cause", ""] + _root_cause(state, records, failure, frames)
    minimal = _minimal_spec(state, records) if failure and failure["trial"] else None
    if failure and failure.get("check"):
        md += ["", "## Minimal reproduction", ""] + _check_reproduction(state, failure)
    else:
        md += ["", "## Minimal reproduction", ""] + reproduction(state.get("argv"), minimal)
    if failure:
        md += ["", "The triage itself, to rerun or resume:", "", "```",
               shlex.join(state.get("argv") or []), "```"]
    md += ["", "## Recommendations", ""] + _recommendations(state, failure)
    if regression:
        md += ["", "## Regression against the baseline", ""] + _regression_section(regression)
    md += ["", "## Time", ""] + _time_section(state)
    text = "\n".join(md) + "\n"
    code = (EXIT_FAILURE if failure else EXIT_REGRESSION if regressed else
            EXIT_INCONCLUSIVE if _unreproduced(state) else EXIT_HEALTHY)
    summary = Summary(
        command="triage", headline=headline, status=STATUS_OF_EXIT[code],
        verdicts=[verdict_row(r.label, r.verdict, r.n_layers, r.seq_len, r.slow_by)
                  for r in rows],
        rows=[r.to_dict() for r in rows],
        failing=(records[failure["trial"]].verdict if failure and failure.get("trial") in
                 records else _failed_checks(state)[0]["verdict"] if failure and
                 failure.get("check") else None),
        details={"target": state["target"], "complete": not state.get("stopped"),
                 "stopped": state.get("stopped"),
                 "threshold": (state.get("sweep") or {}).get("threshold"),
                 "deepest_ok": (state.get("sweep") or {}).get("deepest_ok"),
                 "failure": failure, "checks": [
                     {k: c[k] for k in ("name", "passed", "module", "summary")} |
                     {"verdict": c["verdict"]["name"]}
                     for c in (state.get("checks") or {}).get("results", [])],
                 "env_problems": state.get("env_problems", []), "machine": machine,
                 "efficiency": _efficiency_ref(state),
                 "regression": ({"baseline": regression["path"],
                                 "threshold": regression["threshold"],
                                 "regressions": regressed} if regression else None),
                 "elapsed_s": state.get("elapsed_s"), "baseline_knobs": dict(BASELINE)})
    return text, summary.to_dict()
