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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from nsadiag.report.markdown import (
    RECOMMENDATIONS,
    config_table,
    evidence_section,
    fmt_bytes,
    fmt_s,
    md_table,
    reproduction,
    rows_frame,
)
from nsadiag.report.plots import sweep_plot
from nsadiag.report.summary import Summary, status_of_verdicts, verdict_row
from nsadiag.rundir import TrialRecord
from nsadiag.sweep import Fit, SweepRow, fit_quantity, row_from_record

FASTER_THAN_SAVED = 1.5
"""The rest of the peak growing this many times faster than the saved bytes (first to
last length) is called out."""


def _rest(row: SweepRow) -> int | None:
    if row.peak_rss is None or row.saved_bytes is None:
        return None
    return max(0, row.peak_rss - row.saved_bytes)


def analyse_seq(rows: Sequence[SweepRow]) -> dict[str, Any]:
    """Fits of step time, peak RSS, saved bytes and the rest against S over the OK rows;
    the predicted peaks at 2x and 4x the longest OK length; whether the rest of the peak
    grows much faster than the saved bytes."""
    ok = sorted((r for r in rows if r.verdict == "OK" and r.seq_len), key=lambda r: r.seq_len)
    xs = [r.seq_len for r in ok]
    targets = [2 * xs[-1], 4 * xs[-1]] if xs else []
    values = {"step_s": [r.step_s for r in ok], "peak_rss": [r.peak_rss for r in ok],
              "saved_bytes": [r.saved_bytes for r in ok], "rest": [_rest(r) for r in ok]}
    fits: dict[str, Fit] = {}
    for quantity, ys in values.items():
        pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        fit = fit_quantity(quantity, [p[0] for p in pairs], [p[1] for p in pairs], targets)
        if fit is not None:
            fits[quantity] = fit
    growth = None
    saved, rest = values["saved_bytes"], values["rest"]
    if len(ok) >= 2 and saved[0] and saved[-1] and rest[0] and rest[-1]:
        growth = {"saved": saved[-1] / saved[0], "rest": rest[-1] / rest[0]}
    return {"fits": fits, "targets": targets, "growth": growth,
            "rest_outgrows_saved": bool(growth and
                                        growth["rest"] > FASTER_THAN_SAVED * growth["saved"])}


def _fits_lines(fits: dict[str, Fit]) -> list[str]:
    import pandas as pd

    if not fits:
        return ["Fewer than three OK lengths: no fit."]

    def unit(name: str):
        return fmt_bytes if name != "step_s" else (lambda v: f"{v:.3g} s")

    frame = pd.DataFrame([{
        "quantity": name, "per token (± s.e.)": f"{unit(name)(f.slope)} ± "
                                               f"{unit(name)(f.slope_se)}",
        "R²": f"{f.r2:.3f}", "points": str(f.points), "growth": f.growth(),
        "predicted": ", ".join(f"S={s}: {unit(name)(v)}" for s, v in f.extrapolated.items())
        or "-"} for name, f in fits.items()])
    return md_table(frame, {c: str for c in frame.columns})


def _cliff(analysis: dict[str, Any], total: int) -> list[str]:
    fit = analysis["fits"].get("peak_rss")
    if fit is None or not fit.extrapolated:
        return ["No prediction: the peak's fit is missing or poor."]
    lines = []
    for seq_len, peak in fit.extrapolated.items():
        verdict = "above" if peak > total else "within"
        lines.append(f"At S={seq_len} the peak would be about {fmt_bytes(peak)} "
                     f"({fit.growth()} fit), {verdict} this machine's {fmt_bytes(total)}.")
    if analysis["rest_outgrows_saved"]:
        growth = analysis["growth"]
        lines.append(f"The peak beyond what is saved for backward grew {growth['rest']:.1f}x "
                     f"while the saved bytes grew {growth['saved']:.1f}x: a temporary that "
                     f"grows faster than the activations (a full S x S matrix, an unfused "
                     f"softmax) sets the peak; `nsadiag memory` names the module.")
    return lines


LABEL = "sweep-seq"


def build_seq_report(run_dir: Path, records: Sequence[TrialRecord], meta: dict[str, Any]
                     ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a sweep-seq run directory's records; writes
    sweep.png (time and peak against S) into run_dir."""
    records = sorted(records, key=lambda r: int(r.spec["seq_len"]))
    rows = [row_from_record(record, LABEL) for record in records]
    analysis = analyse_seq(rows)
    failing = next((r for r in records if r.verdict_name != "OK"), None)
    headline = (f"{failing.verdict_name} at S={failing.spec.get('seq_len')}" if failing
                else "all lengths OK")
    total = psutil.virtual_memory().total
    first = records[0].spec if records else {}
    md = [f"# nsadiag sweep-seq: {headline}", "", "## Executive summary", ""]
    md += [f"{len(records)} trial(s) at {first.get('n_layers') or 'the default number of'} "
           f"layer(s); " + (f"the first non-OK is S={failing.spec.get('seq_len')}: "
                            f"**{failing.verdict_name}**. {failing.verdict['reasons'][0]}"
                            if failing else "every length OK.")]
    md += [""] + _cliff(analysis, total)
    md += ["", "## Configuration", ""] + config_table(first, (
        "target", "n_layers", "batch", "dtype", "grad_ckpt", "branches", "backend", "device",
        "steps", "stall_timeout_s", "budget_s", "overrides"))
    frame = rows_frame(rows)
    md += ["", "## Results", ""]
    if not frame.empty:
        table = frame[["seq_len", "verdict", "step_s", "peak_rss", "saved_bytes",
                       "steps_done"]].assign(rest=[_rest(r) for r in rows])
        table = table[["seq_len", "verdict", "step_s", "peak_rss", "saved_bytes", "rest",
                       "steps_done"]]
        table.columns = ["S", "verdict", "step", "peak RSS", "saved for backward",
                         "rest of the peak", "steps"]
        md += md_table(table, {"S": str, "step": fmt_s, "peak RSS": fmt_bytes,
                               "saved for backward": fmt_bytes, "rest of the peak": fmt_bytes,
                               "steps": str})
    else:
        md += ["No trial finished."]
    md += ["", "### Fits against the sequence length", ""] + _fits_lines(analysis["fits"])
    png = sweep_plot({LABEL: rows}, {LABEL: analysis["fits"]}, run_dir / "sweep.png",
                     {LABEL: f"{LABEL} ({first.get('target')}, {first.get('n_layers') or 'default'}"
                             f" layers)"}, x="seq_len")
    if png:
        md += ["", f"![time and memory against the sequence length]({png.name})"]
    md += ["", "## Evidence", ""] + (evidence_section(failing or records[-1]) if records
                                     else ["No trial ran."])
    md += ["", "## Minimal reproduction", ""] + reproduction(meta.get("argv"), failing)
    md += ["", "## Recommendations", ""]
    md += [RECOMMENDATIONS.get(failing.verdict_name, "") if failing else
           "Every length finished: compare the predicted peak with the memory of the machine "
           "the full run uses."]
    summary = Summary(
        command="sweep-seq", headline=headline,
        status=status_of_verdicts(r.verdict for r in rows),
        verdicts=[verdict_row(LABEL, r.verdict, r.n_layers, r.seq_len) for r in rows],
        rows=[r.to_dict() for r in rows],
        fits={LABEL: {q: f.to_dict() for q, f in analysis["fits"].items()}}
        if analysis["fits"] else {},
        failing=failing.verdict if failing else None,
        details={"rest_outgrows_saved": analysis["rest_outgrows_saved"],
                 "machine_memory": total})
    return "\n".join(md) + "\n", summary.to_dict()
