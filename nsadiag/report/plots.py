"""The reports' plots (PNG, matplotlib's Agg backend: no display needed).

Every plot starts its axes at zero and puts integer ticks on counts (layers, tokens);
each run (a label's trials) is named in the legend; a fit is drawn as its line with a band
of two standard errors of the slope around the points' mean; a trial that did not end OK
is a red cross labelled with its verdict, at its measured value or, without one, at the
top of the axis.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nsadiag.memoryrecord import MemoryRecord
from nsadiag.probes.sampler import is_user_file
from nsadiag.record.process_memory import ProcessSeries
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
           quantity: str, scale: float, unit: str, limit: float | None = None,
           cliff: int | None = None) -> None:
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
            predicted = sorted(fit.extrapolated.items())
            _fit_line(ax, fit, xs + [p for p, _ in predicted], xs, scale, color, unit)
            if predicted:
                ax.plot([p for p, _ in predicted], [v / scale for _, v in predicted], "o",
                        mfc="none", color=color, label="predicted by the fit")
                xs_all += [p for p, _ in predicted]
                ys_all += [v / scale for _, v in predicted]
        failed += [(getattr(r, x), None if getattr(r, quantity) is None
                    else getattr(r, quantity) / scale, r.verdict)
                   for r in rows if r.verdict != "OK"]
        xs_all += [getattr(r, x) for r in rows if getattr(r, x) is not None]
        ys_all += ys
    ys_all += [y for _, y, _ in failed if y is not None]
    top = 1.1 * max(ys_all) if ys_all else 1.0
    at = f"{cliff:,} {'layers' if x == 'n_layers' else 'tokens'}" if cliff else ""
    if limit is not None and ys_all and limit / scale <= 1.5 * max(ys_all):
        top = 1.1 * max(top, limit / scale)
        ax.axhline(limit / scale, color="red", linestyle="--", linewidth=1,
                   label="this machine's memory" + (f" (reached near {at})" if cliff else ""))
    elif limit is not None and cliff:
        ax.plot([], [], " ", label=f"memory runs out near {at} (off the chart)")
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


def _fit_line(ax: Any, fit: Fit, span: Sequence[float], xs: Sequence[float], scale: float,
              color: str, unit: str) -> None:
    import numpy as np

    grid = np.linspace(0, max(span) * 1.05, 50)
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
               names: Mapping[str, str] | None = None, x: str = "n_layers",
               memory: int | None = None, cliff: int | None = None) -> Path | None:
    """Step time and peak memory against ``x`` (layers or seq_len), one colour per label,
    with their fits and what they predict; the machine's ``memory`` and the point where
    the fitted peak reaches it (``cliff``) on the memory panel. None when no trial measured
    a step or a peak."""
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
    _panel(ax_m, rows_by_label, fits, names, x, "peak_rss", 2**20, f"MiB/{per}", memory, cliff)
    ax_t.set(xlabel=unit, ylabel="step time (s)", title="time per step")
    ax_m.set(xlabel=unit, ylabel="peak RSS (MiB)", title="peak memory")
    fig.tight_layout()
    return _save(fig, path)


def memory_plot(measured: MemoryRecord, path: Path) -> Path | None:
    """Bytes saved for backward per layer (a layer standing out in red) and per NSA
    branch; None when nothing was saved."""
    layers, branches = measured.per_layer, measured.saved_by_branch
    if not layers and not branches:
        return None
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, (ax_l, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2),
                                     gridspec_kw={"width_ratios": [3, 1]})
    standouts = set(measured.layer_standouts)
    positions = list(range(len(layers)))
    ax_l.bar(positions, [row.saved / 2**20 for row in layers],
             color=["red" if row.layer in standouts else "C0" for row in layers],
             label="saved for backward")
    ax_l.set_xticks(positions, [row.layer for row in layers], rotation=45, ha="right",
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


def process_memory_plot(drawn: Sequence[tuple[str, ProcessSeries]], path: Path
                        ) -> Path | None:
    """Private (solid) and shared (dashed) MiB of each (label, series) over the run's
    seconds, one colour per process; None when none is given."""
    if not drawn:
        return None
    start = min(s.points[0].t for _, s in drawn)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for i, (label, s) in enumerate(drawn):
        xs = [p.t - start for p in s.points]
        ax.plot(xs, [p.private / 2**20 for p in s.points], color=f"C{i}", marker=".",
                label=f"{label}: private")
        ax.plot(xs, [p.shared / 2**20 for p in s.points], color=f"C{i}", linestyle="--",
                label=f"{label}: shared")
    ax.set(xlabel="seconds since the first reading", ylabel="MiB",
           title="private (solid) and shared (dashed) memory of each process")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


FLAME_DEPTH = 30
"""Frames drawn above the root at most; deeper ones are cut (profile.folded has all)."""
FLAME_MIN_SHARE = 0.003
"""Frames with a smaller share of the samples are not drawn."""
LEFT_OUT = re.compile(r"/nsadiag/|^<|/torch/nn/modules/module\.py$")
"""Frames the picture leaves out: nsadiag's own (the harness under every stack), the
interpreter's start-up, and torch.nn.Module's call wrappers around every module call."""
USER, LIBRARY, MARKED = "#f28e2b", "#9db4cf", "#d62728"


def _profile_stacks(profile: Mapping[str, Any]) -> list[tuple[list[tuple[str, bool]], int]]:
    """(frames outermost first as (label, user code), count) of a raw profile (the
    sampler's profile.json), the start-up phase and LEFT_OUT frames left out, the phase at
    the root."""
    stacks = []
    for entry in profile.get("stacks") or []:
        phase = entry.get("phase") or "other"
        if phase == "build":
            continue
        frames = [(f"[{phase}]", False)]
        for function, file, line in entry.get("frames") or []:
            if LEFT_OUT.search(file):
                continue
            frames.append((f"{function} ({Path(file).name}:{line})", is_user_file(file)))
        stacks.append((frames, int(entry.get("count", 0))))
    return [(frames, n) for frames, n in stacks if n > 0]


def _flame_tree(stacks: list[tuple[list[tuple[str, bool]], int]]) -> dict[str, Any]:
    root: dict[str, Any] = {"name": "all", "count": 0, "user": False, "children": {}}
    for frames, n in stacks:
        root["count"] += n
        node = root
        for name, user in frames:
            node = node["children"].setdefault(name, {"name": name, "count": 0,
                                                      "user": user, "children": {}})
            node["count"] += n
    return root


def _marked(label: str, mark: tuple[str, int, int] | None) -> bool:
    """Whether a frame label "function (file.py:line)" lies in ``mark`` = (file name,
    first line, last line)."""
    if mark is None or not label.endswith(")"):
        return False
    name, _, line = label[label.rfind("(") + 1:-1].rpartition(":")
    return name == mark[0] and line.isdigit() and mark[1] <= int(line) <= mark[2]


def flame_plot(profile: Mapping[str, Any], path: Path, title: str,
               mark: tuple[str, int, int] | None = None) -> Path | None:
    """A flame graph of a sampled profile (the sampler's profile.json): each frame a bar as
    wide as its share of the samples taken while training, callers below callees, the
    phase at the root; the user's own code orange, libraries blue, frames that lie in
    ``mark`` (the culprit: file name, first and last line) red. None without a sample of
    training."""
    stacks = _profile_stacks(profile)
    if not stacks:
        return None
    plt = _pyplot()
    root = _flame_tree(stacks)
    total = root["count"]
    depth = min(FLAME_DEPTH, max(len(frames) for frames, _ in stacks))
    fig, ax = plt.subplots(figsize=(12, 1.4 + 0.3 * depth))

    def draw(node: dict[str, Any], x: float, level: int) -> None:
        for child in sorted(node["children"].values(), key=lambda c: c["name"]):
            width = child["count"] / total
            if width >= FLAME_MIN_SHARE and level < depth:
                color = MARKED if _marked(child["name"], mark) else \
                    USER if child["user"] else LIBRARY
                ax.barh(level, width, left=x, height=0.92, color=color,
                        edgecolor="white", linewidth=0.5)
                room = int(width * 150)
                if room >= 4:
                    label = child["name"]
                    text = label if len(label) <= room else label[:room - 1] + "…"
                    ax.text(x + 0.002, level, text, va="center", ha="left", fontsize=7,
                            clip_on=True)
                draw(child, x, level + 1)
            x += width

    draw(root, 0.0, 0)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.6, depth - 0.4)
    ax.set_yticks([])
    ax.set_xlabel(f"share of the {total} stack samples taken while training")
    ax.set_title(title, fontsize=10, loc="left")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=USER, label="your code"), Patch(color=LIBRARY,
                                                                   label="libraries"),
                       *([Patch(color=MARKED, label=f"the line named ({mark[0]}:"
                                                     f"{mark[1]}" + (f"-{mark[2]}" if
                                                                     mark[2] > mark[1] else "")
                                                     + ")")]
                         if mark else [])], fontsize=8, loc="lower right",
              bbox_to_anchor=(1.0, 1.0), ncol=3, frameon=False)
    fig.tight_layout()
    return _save(fig, path)


def flame_section(record: Any, finding: Any, run_dir: Path, name: str = "flame.png",
                  also: Sequence[Any] = ()) -> list[str]:
    """Markdown lines embedding a flame graph of a trial record's sampled profile (written
    to run_dir/``name``, the finding's culprit in red) and naming the folded stacks for
    speedscope; the first of ``also`` (the same failure's repeats) that has one when the
    record left no profile of training (a trial stopped while the model was still being
    built, on a busy machine); [] when none did."""
    for candidate in (record, *also):
        lines = _flame_lines(candidate, finding, run_dir, name)
        if lines:
            return lines
    return []


def _flame_lines(record: Any, finding: Any, run_dir: Path, name: str) -> list[str]:
    from nsadiag.finding.culprit import profile_path, read_profile_json

    source = profile_path(record)
    profile = read_profile_json(record) if source is not None else None
    if profile is None:
        return []
    culprit = getattr(finding, "culprit", None)
    mark = (Path(culprit.file).name, culprit.line, culprit.end_line or culprit.line) \
        if culprit is not None and culprit.file and culprit.line else None
    png = flame_plot(profile, run_dir / name, f"sampled profile of {Path(record.trial_dir).name}"
                     f" (width: share of the samples)", mark)
    if png is None:
        return []
    folded = source.with_name("profile.folded")
    shown = folded.relative_to(run_dir) if folded.is_relative_to(run_dir) else folded.name
    return ["", f"![flame graph of the sampled profile]({png.name})", "",
            f"The same stacks for a flame-graph viewer: `{shown}` (open it in "
            f"https://www.speedscope.app)."]
