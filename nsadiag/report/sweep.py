"""The report of a layer sweep (sweep-layers, isolate-branch): Markdown, summary, plot.

The shape follows a hand-written hang report — executive summary, configuration, results,
evidence, analysis (ruled out / implicated), minimal reproduction, recommendations — and
every sentence is built from a measured number in the records. Trials are grouped by
their label (run.json's labels: "all branches" / "<branch> only" for isolate-branch; the
command's name for an unlabelled sweep), one fit per label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nsadiag.report.markdown import (
    RECOMMENDATIONS,
    config_table,
    env_rows,
    evidence_section,
    fmt_bytes,
    fmt_s,
    md_table,
    reproduction,
    results_table,
    stall_summary,
)
from nsadiag.report.plots import sweep_plot
from nsadiag.report.summary import Summary, status_of_rows, verdict_row
from nsadiag.rundir import TrialRecord
from nsadiag.sweep import Fit, SweepRow, analyse, first_failure, row_from_record

CONFIG_KEYS = ("target", "seq_len", "batch", "dtype", "grad_ckpt", "branches", "backend",
               "device", "steps", "stall_timeout_s", "budget_s", "memory_cap_bytes",
               "overrides")


def run_label(meta: Mapping[str, Any], record: TrialRecord) -> str:
    """A trial's label: the one run.json gives it, else the command's name."""
    label = (meta.get("labels") or {}).get(Path(record.trial_dir).name)
    return label or str(meta.get("command_name") or "sweep-layers")


def fits_section(fits: Mapping[str, Fit], unit_x: str = "layer") -> list[str]:
    """The fits of one label as a table (slope with its standard error, R², growth)."""
    import pandas as pd

    if not fits:
        return [f"Fewer than three OK {unit_x} counts: no fit."]

    def unit(name: str):
        return fmt_bytes if name in ("peak_rss", "peak_cuda", "saved_bytes", "rest_bytes",
                                     "rest") else \
            (lambda v: f"{v:.3g} s")

    frame = pd.DataFrame([{
        "quantity": name,
        f"per {unit_x} (± s.e.)": f"{unit(name)(f.slope)} ± {unit(name)(f.slope_se)}",
        "intercept": unit(name)(f.intercept), "R²": f"{f.r2:.3f}", "points": str(f.points),
        "growth": f.growth(),
        "extrapolated": ", ".join(f"{n}: {unit(name)(v)}" for n, v in f.extrapolated.items())
        or "-"} for name, f in fits.items()])
    return md_table(frame, {c: str for c in frame.columns})


def attribution_table(full: Sequence[SweepRow], alone: Sequence[SweepRow]) -> list[str]:
    """Per layer count: the branch alone against all branches, time and memory."""
    import pandas as pd

    both = pd.merge(pd.DataFrame([r.to_dict() for r in full]),
                    pd.DataFrame([r.to_dict() for r in alone]), on="n_layers",
                    suffixes=(" (all)", " (branch)"))
    if both.empty:
        return ["No layer count ran both ways."]
    share = both["step_s (branch)"] / both["step_s (all)"]
    table = pd.DataFrame({
        "layers": both["n_layers"], "step s (all)": both["step_s (all)"],
        "step s (branch)": both["step_s (branch)"],
        "share of time": [f"{100 * s:.0f}%" if s == s else "-" for s in share],
        "peak (all)": both["peak_rss (all)"], "peak (branch)": both["peak_rss (branch)"]})
    return md_table(table, {"layers": str, "step s (all)": fmt_s, "step s (branch)": fmt_s,
                            "share of time": str, "peak (all)": fmt_bytes,
                            "peak (branch)": fmt_bytes})


def analysis_section(rows: Sequence[SweepRow], analysis: dict[str, Any],
                     failing: TrialRecord | None) -> list[str]:
    """What the sweep rules out and what it implicates, each from a fit or a trial."""
    ruled_out, implicated = [], []
    ok = [r for r in rows if r.verdict == "OK"]
    if ok:
        best = max(ok, key=lambda r: r.n_layers)
        ruled_out.append(f"A hang at small depth: {len(ok)} layer count(s) up to "
                         f"{best.n_layers} finished every step (step {fmt_s(best.step_s)} s).")
    step_fit = analysis["fits"].get("step_s")
    if step_fit and step_fit.poor:
        step_fit = None  # says nothing either way
    if step_fit and not step_fit.super_linear:
        ruled_out.append(f"Super-linear time growth: step time rises {step_fit.slope:.3f} s per "
                         f"layer on a straight line (R² {step_fit.r2:.3f}).")
    elif step_fit:
        implicated.append(f"Step time grows faster than linearly with depth (quadratic term "
                          f"{step_fit.curvature:.4f} s/layer²).")
    growth = analysis.get("memory_growth")
    if growth and growth["outgrows"]:
        implicated.append(f"The peak grows faster than the bytes saved for backward: from "
                          f"{growth['from']} to {growth['to']} layers the rest of the peak "
                          f"grew {growth['rest']:.1f}x while the saved bytes grew "
                          f"{growth['saved']:.1f}x (peak {growth['peak']:.1f}x): a temporary "
                          f"or a cache that grows faster than the activations sets the peak; "
                          f"`nsadiag memory` names the module.")
    elif growth:
        ruled_out.append(f"A peak outgrowing the activations: from {growth['from']} to "
                         f"{growth['to']} layers the saved bytes grew {growth['saved']:.1f}x "
                         f"and the rest of the peak {growth['rest']:.1f}x.")
    mem_fit = analysis["fits"].get("peak_rss")
    if mem_fit and mem_fit.poor:
        mem_fit = None
    if mem_fit and mem_fit.super_linear:
        implicated.append(f"Peak memory grows faster than linearly with depth (+"
                          f"{fmt_bytes(mem_fit.slope)} per layer on average).")
    elif mem_fit:
        ruled_out.append(f"A memory blow-up with depth: peak RSS grows {fmt_bytes(mem_fit.slope)}"
                         f" per layer, linearly (R² {mem_fit.r2:.3f}).")
    if failing:
        facts = failing.verdict.get("facts", {})
        name = failing.verdict["name"]
        where = facts.get("hot_frame") or facts.get("last_module") or facts.get("frame")
        implicated.append(f"{failing.spec.get('n_layers')} layers end as {name}"
                          + (f", at {where}" if where else "") + ".")
        if name == "SLOW":
            gap = facts.get("since_last_event_s")
            last = f", the last {gap:.1f} s before the kill" if gap is not None else ""
            ruled_out.append("A hang: it was still progressing (heartbeats or sampler "
                             f"pulses) when the budget ran out{last}"
                             + (f"; ETA {facts['eta_s']:.0f} s more." if facts.get("eta_s")
                                else "."))
    return ["Ruled out:", ""] + [f"- {x}" for x in ruled_out or ["nothing yet"]] + \
        ["", "Implicated:", ""] + [f"- {x}" for x in implicated or ["nothing: every trial OK"]]


def legend_names(groups: Mapping[str, Sequence[SweepRow]], spec: Mapping[str, Any]
                 ) -> dict[str, str]:
    """Legend text per label: the label and what ran (target, sequence length)."""
    what = f"{spec.get('target')}, S={spec.get('seq_len')}" if spec else ""
    return {label: f"{label} ({what})" if what else label for label in groups}


def build_report(run_dir: Path, records: Sequence[TrialRecord], meta: dict[str, Any]
                 ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a layer sweep's records, grouped by label; writes
    sweep.png into run_dir. Redaction is the caller's (nsadiag.report.dispatch)."""
    command = str(meta.get("command_name") or "sweep-layers")
    groups: dict[str, list[SweepRow]] = {}
    records = sorted(records, key=lambda r: int(r.spec["n_layers"]))
    for record in records:
        label = run_label(meta, record)
        groups.setdefault(label, []).append(row_from_record(record, label))
    all_rows = [r for rows in groups.values() for r in rows]
    analyses = {label: analyse(rows) for label, rows in groups.items()}
    failing = first_failure(records) or next(
        (r for r in records if r.verdict_name == "INCONCLUSIVE"), None)
    big = next((r for r in all_rows if r.slow_by == "size"), None)
    first = records[0].spec if records else {}
    png = sweep_plot(groups, {label: a["fits"] for label, a in analyses.items()},
                     run_dir / "sweep.png", legend_names(groups, first))
    headline = (f"{failing.verdict_name} at {failing.spec.get('n_layers')} layers"
                if failing else "all trials OK" if big is None else
                f"no failure; slow by size from {big.n_layers} layer(s)")
    md = [f"# nsadiag {command}: {headline}", "", "## Executive summary", ""]
    if failing:
        md += [f"{len(records)} trial(s); the first non-OK is {failing.spec.get('n_layers')} "
               f"layers: **{failing.verdict_name}**. " + failing.verdict["reasons"][0]]
    elif big is not None:
        md += [f"{len(records)} trial(s), none failed: from {big.n_layers} layer(s) the work "
               f"itself outlasts the budget (slow by size: no host read per token, no loop "
               f"of tiny ops). A longer `--budget` or fewer `--steps` lets it finish."]
    else:
        md += [f"{len(records)} trial(s), every one OK."]
    for label, analysis in analyses.items():
        fit = analysis["fits"].get("step_s")
        if fit:
            md += ["", f"{label}: {fit.slope:.3f} ± {fit.slope_se:.3f} s per layer "
                   f"per step ({fit.growth()}, R² {fit.r2:.3f}, {fit.points} points)."]
    md += ["", "## Configuration", ""] + config_table(first, CONFIG_KEYS,
                                                     env_rows(meta.get("env") or {}))
    md += ["", "## Results", ""] + results_table(all_rows)
    for label, analysis in analyses.items():
        md += ["", f"### Fits against layers — {label}", ""] + fits_section(analysis["fits"])
    if meta.get("branch") and len(groups) == 2:
        md += ["", f"### What the {meta['branch']} branch costs", ""]
        md += attribution_table(*groups.values())
    if png:
        md += ["", f"![time and memory against layers]({png.name})"]
    md += ["", "## Evidence", ""]
    md += evidence_section(failing or records[-1]) if records else ["No trial ran."]
    main = next(iter(analyses.values()), {"fits": {}})
    md += ["", "## Analysis", ""] + analysis_section(all_rows, main, failing)
    md += ["", "## Minimal reproduction", ""] + reproduction(meta.get("argv"), failing)
    md += ["", "## Recommendations", ""]
    md += [RECOMMENDATIONS.get(failing.verdict_name, "") if failing else
           "Healthy at every tested depth: if the full run still stops, compare its "
           "configuration with this one (sequence length, dtype, world size)."]
    details: dict[str, Any] = {
        "threshold": int(failing.spec["n_layers"]) if failing else None,
        "stall": stall_summary(failing) if failing else None}
    if command == "isolate-branch":
        details["branch"] = meta.get("branch")
    verdicts = [verdict_row(r.label, r.verdict, r.n_layers, r.seq_len, r.slow_by)
                for r in all_rows]
    summary = Summary(
        command=command, headline=headline,
        status=status_of_rows(verdicts),
        verdicts=verdicts,
        rows=[r.to_dict() for r in all_rows],
        fits={label: {q: f.to_dict() for q, f in a["fits"].items()}
              for label, a in analyses.items() if a["fits"]},
        failing=failing.verdict if failing else None, details=details)
    return "\n".join(md) + "\n", summary.to_dict()
