"""The report of a layer sweep (sweep-layers, isolate-branch): Markdown, summary, plot.

The top block and summary of the finding (nsadiag.finding.sweep), then the seeds' order:
results (one line per trial), configuration, measurements and fits with the plot (time and
memory against layers, the fits, the predicted peak and where memory runs out), evidence
of the failing trial (with a flame graph of its profile), root cause (ruled out /
implicated), minimal reproduction, recommendations. Trials are grouped by their label
(run.json's labels: "all branches" / "<branch> only" for isolate-branch; the command's
name for an unlabelled sweep), one fit per label.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nsadiag.finding.commands import reproduce
from nsadiag.finding.sweep import SweepAnalysis
from nsadiag.findingdata import Finding, Item
from nsadiag.fmt import bytes_cell, seconds_cell
from nsadiag.recordspec import RecordSpec
from nsadiag.report.markdown import (
    config_table,
    env_rows,
    evidence_section,
    md_table,
    reproduction,
    results_table,
    stall_summary,
)
from nsadiag.report.plots import flame_section, sweep_plot
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary, verdict_row
from nsadiag.report.top import cause_section, items, recommendations
from nsadiag.runmeta import RunMeta
from nsadiag.sweep import Fit, SweepRow

CONFIG_KEYS = ("target", "seq_len", "batch", "dtype", "grad_ckpt", "branches", "backend",
               "device", "steps", "stall_timeout_s", "budget_s", "memory_cap_bytes",
               "overrides")


def fits_section(fits: Mapping[str, Fit], unit_x: str = "layer") -> list[str]:
    """The fits of one label as a table (slope with its standard error, R², growth)."""
    import pandas as pd

    if not fits:
        return [f"Fewer than three OK {unit_x} counts: no fit."]

    def unit(name: str):
        return bytes_cell if name in ("peak_rss", "peak_cuda", "saved_bytes", "rest_bytes",
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
    return md_table(table, {"layers": str, "step s (all)": seconds_cell,
                            "step s (branch)": seconds_cell, "share of time": str,
                            "peak (all)": bytes_cell, "peak (branch)": bytes_cell})


def labelled_results(results: Sequence[Item], rows: Sequence[SweepRow]) -> list[str]:
    """The results list (one item per row, in the rows' order); with more than one label
    (isolate-branch runs every layer count with all branches, then with the branch alone)
    each label's items come under a line naming it."""
    labels = list(dict.fromkeys(row.label for row in rows))
    if len(labels) < 2 or len(results) != len(rows):
        return items(results)
    md: list[str] = []
    for label in labels:
        mine = [item for item, row in zip(results, rows, strict=True) if row.label == label]
        md += [*([""] if md else []), f"**{label}**", "", *items(mine)]
    return md


def legend_names(groups: Mapping[str, Sequence[SweepRow]], spec: RecordSpec | None
                 ) -> dict[str, str]:
    """Legend text per label: the label and what ran (target, sequence length)."""
    what = f"{spec.target}, S={spec.seq_len}" if spec is not None and spec.keys else ""
    return {label: f"{label} ({what})" if what else label for label in groups}


def build_report(run_dir: Path, measured: SweepAnalysis, meta: RunMeta, finding: Finding
                 ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a layer sweep's measurements (its trials grouped by
    label, nsadiag.finding.sweep.measure_sweep) and its ``finding`` (the one the sweep kept,
    decided as it ended); writes sweep.png (and flame.png of a failing trial's profile)
    into run_dir. Redaction is the caller's (nsadiag.report.dispatch)."""
    command = measured.command
    memory = measured.facts.memory
    groups, failing, facts = measured.groups, measured.failing, measured.facts
    all_rows = measured.rows
    records = measured.records
    first = records[0].spec if records else None
    png = sweep_plot(groups, measured.fits, run_dir / "sweep.png", legend_names(groups, first),
                     memory=memory, cliff=facts.cliff)
    report = Report.of(finding, results=labelled_results(finding.results, all_rows))
    report.add("Configuration", config_table(first.to_dict() if first else {}, CONFIG_KEYS,
                                             env_rows(meta.env)))
    md = report.add("Measurements", results_table(all_rows)).body
    for label, fits in measured.fits.items():
        md += ["", f"### Fits against layers — {label}", ""] + fits_section(fits)
    if meta.branch and len(groups) == 2:
        md += ["", f"### What the {meta.branch} branch costs", ""]
        md += attribution_table(*groups.values())
    if png:
        md += ["", f"![time and memory against layers, with the fits]({png.name})"]
    md = report.add("Evidence", evidence_section(failing or records[-1]) if records
                    else ["No trial ran."]).body
    if failing is not None:
        md += flame_section(failing, finding, run_dir)
    report.add("Root cause", cause_section(finding))
    report.add("Minimal reproduction", reproduction(
        meta.argv, reproduce(failing.spec) if failing else None))
    report.add("Recommendations", recommendations(finding))
    details: dict[str, Any] = {
        "finding": finding.to_dict(),
        "threshold": failing.spec.n_layers if failing and failing.spec.n_layers else None,
        "stall": stall_summary(failing) if failing else None}
    if command == "isolate-branch":
        details["branch"] = meta.branch
    verdicts = [verdict_row(r.label, r.verdict, r.n_layers, r.seq_len, r.slow_by)
                for r in all_rows]
    summary = Summary(
        command=command, headline=finding.headline, status=finding.status,
        verdicts=verdicts,
        rows=[r.to_dict() for r in all_rows],
        fits={label: {q: f.to_dict() for q, f in fits.items()}
              for label, fits in measured.fits.items() if fits},
        failing=failing.verdict.to_dict() if failing else None, details=details)
    return report.markdown(), summary.to_dict()
