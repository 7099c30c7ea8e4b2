"""The reports' plots (PNG, matplotlib's Agg backend: no display needed).

Every plot starts its axes at zero and puts integer ticks on counts (layers, tokens);
each run (a label's trials) is named in the legend; a fit is drawn as its line with a band
of two standard errors of the slope around the points' mean; a trial that did not end OK
is a red cross labelled with its verdict, at its measured value or, without one, at the
top of the axis.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nsadiag.rundir import write_bytes
from nsadiag.sweep import Fit, SweepRow

BAND_SE = 2.0
"""The band around a fit line: this many standard errors of the slope."""


def _save(fig: Any, path: Path) -> Path:
    """Save a figure whole (nsadiag.rundir.write_bytes: never through a planted link);
    ValueError (one line) when it cannot be written, with nothing half-written left."""
    plt = _pyplot()
    image = io.BytesIO()
    try:
        fig.savefig(image, dpi=100, format="png")
    finally:
        plt.close(fig)
    return write_bytes(path, image.getvalue())


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panel(ax: Any, rows_by_label: Mapping[str, Sequence[SweepRow]],
           fits: Mapping[str, Mapping[str, Fit]], names: Mapping[str, str], x: str,
           quantity: str, scale: float, unit: str) -> None:
    from matplotlib.ticker import MaxNLocator

    failed: list[tuple[float, float | None, str]] = []
    xs_all: list[float] = []
    ys_all: list[float] = []
    for i, (label, rows) in enumerate(rows_by_label.items()):
        color = f"C{i}"
        ok = [r for r in rows if r.verdict == "OK" and getattr(r, quantity) is not None]
        xs = [getattr(r, x) for r in ok]
        ys = [getattr(r, quantity) / scale for r in ok]
        ax.plot(xs, ys, "o", color=color, label=names.get(label, label))
        fit = (fits.get(label) or {}).get(quantity)
        if fit is not None and xs:
            _fit_line(ax, fit, xs, scale, color, unit)
        failed += [(getattr(r, x), None if getattr(r, quantity) is None
                    else getattr(r, quantity) / scale, r.verdict)
                   for r in rows if r.verdict != "OK"]
        xs_all += [getattr(r, x) for r in rows if getattr(r, x) is not None]
        ys_all += ys
    ys_all += [y for _, y, _ in failed if y is not None]
    top = 1.1 * max(ys_all) if ys_all else 1.0
    for i, (px, py, verdict) in enumerate(failed):
        y = py if py is not None else 0.95 * top  # no measured value: at the top
        unmeasured = any(v is None for _, v, _ in failed)
        ax.plot([px], [y], "X", color="red", markersize=9,
                label=("not OK" + (" (unmeasured: at the top)" if unmeasured else ""))
                if i == 0 else None)
        ax.annotate(verdict, (px, y), textcoords="offset points", xytext=(4, 4),
                    color="red", fontsize=8)
    ax.set_xlim(0, 1.08 * max(xs_all, default=1) + 0.2)
    ax.set_ylim(0, top)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _fit_line(ax: Any, fit: Fit, xs: Sequence[float], scale: float, color: str,
              unit: str) -> None:
    import numpy as np

    grid = np.linspace(0, max(xs) * 1.05, 50)
    mean = float(np.mean(xs))
    at_mean = fit.slope * mean + fit.intercept
    line = (fit.slope * grid + fit.intercept) / scale
    spread = BAND_SE * fit.slope_se * np.abs(grid - mean) / scale
    style = ":" if fit.poor else "-"
    ax.plot(grid, line, style, color=color, linewidth=1,
            label=f"fit: {fit.slope / scale:.3g} {unit} (band ±{BAND_SE:g} s.e. of the slope)"
                  + (", poor fit" if fit.poor else ""))
    ax.fill_between(grid, line - spread, line + spread, color=color, alpha=0.15)
    ax.plot([mean], [at_mean / scale], "+", color=color)


def sweep_plot(rows_by_label: Mapping[str, Sequence[SweepRow]],
               fits: Mapping[str, Mapping[str, Fit]], path: Path,
               names: Mapping[str, str] | None = None, x: str = "n_layers") -> Path | None:
    """Step time and peak memory against ``x`` (layers or seq_len), one colour per label,
    with their fits; None when no trial measured a step or a peak."""
    measured = [r for rows in rows_by_label.values() for r in rows
                if r.step_s is not None or r.peak_rss is not None]
    if not measured:
        return None
    plt = _pyplot()
    names = names or {}
    unit = "layers" if x == "n_layers" else "tokens per sequence (S)"
    per = "layer" if x == "n_layers" else "token"
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    _panel(ax_t, rows_by_label, fits, names, x, "step_s", 1.0, f"s/{per}")
    _panel(ax_m, rows_by_label, fits, names, x, "peak_rss", 2**20, f"MiB/{per}")
    ax_t.set(xlabel=unit, ylabel="step time (s)", title="time per step")
    ax_m.set(xlabel=unit, ylabel="peak RSS (MiB)", title="peak memory")
    fig.tight_layout()
    return _save(fig, path)


def memory_plot(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Bytes saved for backward per layer (a layer standing out in red) and per NSA
    branch; None when nothing was saved."""
    layers = summary.get("per_layer") or []
    branches = summary.get("saved_by_branch") or {}
    if not layers and not branches:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, (ax_l, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2),
                                     gridspec_kw={"width_ratios": [3, 1]})
    standouts = set(summary.get("layer_standouts") or [])
    positions = list(range(len(layers)))
    ax_l.bar(positions, [row["saved"] / 2**20 for row in layers],
             color=["red" if row["layer"] in standouts else "C0" for row in layers],
             label="saved for backward")
    ax_l.set_xticks(positions, [row["layer"] for row in layers], rotation=45, ha="right",
                    fontsize=8)
    ax_l.set(ylabel="MiB", title="saved for backward per layer (first forward)")
    if standouts:
        ax_l.bar([], [], color="red", label="more than 4x the median layer")
    ax_l.set_ylim(bottom=0)
    ax_l.legend(fontsize=8)
    names = list(branches)
    ax_b.bar(names, [branches[n] / 2**20 for n in names], color="C1", label="NSA branch")
    ax_b.set(ylabel="MiB", title="per NSA branch (all layers)")
    ax_b.set_ylim(bottom=0)
    ax_b.yaxis.set_major_locator(MaxNLocator(nbins=6))
    if names:
        ax_b.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)
