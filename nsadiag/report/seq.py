"""The report of `nsadiag sweep-seq`: time and memory against the sequence length.

Memory cliffs live in the sequence length: a model whose peak grows faster than what its
forward saves for backward builds a large temporary (a full S x S score matrix, an
unfused softmax) that a longer sequence turns into an OOM. For each length the report
gives the verdict, step time, peak RSS, the bytes saved for backward and the rest of the
peak (autograd and temporary scratch, the model and the optimizer); fits of step time and
peak against S (linear, or super-linear when a quadratic term explains the growth); and
the predicted peak at twice and four times the longest length beside this machine's
memory: the cliff, before a run falls off it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nsadiag.finding.commands import reproduce
from nsadiag.finding.sweep import SweepAnalysis
from nsadiag.findingdata import Finding
from nsadiag.fmt import bytes_cell, seconds_cell
from nsadiag.recordspec import RecordSpec
from nsadiag.report.markdown import (
    config_table,
    evidence_section,
    md_table,
    reproduction,
    rows_frame,
)
from nsadiag.report.plots import flame_section, sweep_plot
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary, verdict_row
from nsadiag.report.top import cause_section, recommendations
from nsadiag.runmeta import RunMeta
from nsadiag.sweep import Fit, SweepRow


def _rest(row: SweepRow) -> int | None:
    if row.peak_rss is None or row.saved_bytes is None:
        return None
    return max(0, row.peak_rss - row.saved_bytes)


def _fits_lines(fits: dict[str, Fit]) -> list[str]:
    import pandas as pd

    if not fits:
        return ["Fewer than three OK lengths: no fit."]

    def unit(name: str):
        return bytes_cell if name != "step_s" else (lambda v: f"{v:.3g} s")

    frame = pd.DataFrame([{
        "quantity": name, "per token (± s.e.)": f"{unit(name)(f.slope)} ± "
                                               f"{unit(name)(f.slope_se)}",
        "R²": f"{f.r2:.3f}", "points": str(f.points), "growth": f.growth(),
        "predicted": ", ".join(f"S={s}: {unit(name)(v)}" for s, v in f.extrapolated.items())
        or "-"} for name, f in fits.items()])
    return md_table(frame, {c: str for c in frame.columns})


LABEL = "sweep-seq"


def build_seq_report(run_dir: Path, measured: SweepAnalysis, meta: RunMeta, finding: Finding
                     ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a sweep-seq run directory's measurements
    (nsadiag.finding.sweep.measure_sweep) and its ``finding`` (the one the sweep kept,
    decided as it ended); writes sweep.png (time and peak against S, the fits, the
    predicted peak and the cliff) into run_dir."""
    facts, failing = measured.facts, measured.failing
    total = facts.memory
    rows = measured.rows
    records = measured.records
    first = records[0].spec if records else RecordSpec()
    report = Report.of(finding)
    report.add("Configuration", config_table(first.to_dict(), (
        "target", "n_layers", "batch", "dtype", "grad_ckpt", "branches", "backend", "device",
        "steps", "stall_timeout_s", "budget_s", "overrides")))
    frame = rows_frame(rows)
    md = report.add("Measurements", []).body
    if not frame.empty:
        table = frame[["seq_len", "verdict", "step_s", "peak_rss", "saved_bytes",
                       "steps_done"]].assign(rest=[_rest(r) for r in rows])
        table = table[["seq_len", "verdict", "step_s", "peak_rss", "saved_bytes", "rest",
                       "steps_done"]]
        table.columns = ["S", "verdict", "step", "peak RSS", "saved for backward",
                         "rest of the peak", "steps"]
        md += md_table(table, {"S": str, "step": seconds_cell, "peak RSS": bytes_cell,
                               "saved for backward": bytes_cell, "rest of the peak": bytes_cell,
                               "steps": str})
    else:
        md += ["No trial finished."]
    md += ["", "### Fits against the sequence length", ""] + _fits_lines(facts.fits)
    png = sweep_plot({LABEL: rows}, {LABEL: dict(facts.fits)}, run_dir / "sweep.png",
                     {LABEL: f"{LABEL} ({first.target}, {first.n_layers or 'default'}"
                             f" layers)"}, x="seq_len", memory=total, cliff=facts.cliff)
    if png:
        md += ["", f"![time and memory against the sequence length, the fits and the "
                   f"predicted cliff]({png.name})"]
    md = report.add("Evidence", evidence_section(failing or records[-1]) if records
                    else ["No trial ran."]).body
    if failing is not None:
        md += flame_section(failing, finding, run_dir)
    report.add("Root cause", cause_section(finding))
    report.add("Minimal reproduction", reproduction(
        meta.argv, reproduce(failing.spec) if failing else None))
    report.add("Recommendations", recommendations(finding))
    summary = Summary(
        command="sweep-seq", headline=finding.headline, status=finding.status,
        verdicts=[verdict_row(LABEL, r.verdict, r.n_layers, r.seq_len, r.slow_by)
                  for r in rows],
        rows=[r.to_dict() for r in rows],
        fits={LABEL: {q: f.to_dict() for q, f in facts.fits.items()}} if facts.fits else {},
        failing=failing.verdict.to_dict() if failing else None,
        details={"finding": finding.to_dict(),
                 "rest_outgrows_saved": bool(facts.growth and facts.growth["outgrows"]),
                 "machine_memory": total, "predicted_cliff": facts.cliff})
    return report.markdown(), summary.to_dict()
