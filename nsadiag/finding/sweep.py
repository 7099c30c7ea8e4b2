"""The findings of a sweep: sweep-layers and isolate-branch (layers), sweep-seq (S).

A sweep fails at its first failing trial (nsadiag.sweep.first_failure: a SLOW by size is
no failure), whose finding (nsadiag.finding.trial) gives the line, the proof and the next
step; the sweep adds what its fits rule out or implicate (linear growth, a peak that
outgrows what is saved for backward). A sweep over S also predicts the memory cliff: the
sequence length where the fitted peak reaches this machine's memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsadiag.finding import Finding, Item, fail, kind_of, ok, warn
from nsadiag.finding.commands import reproduce
from nsadiag.finding.numbers import cost_ratio, sig, size
from nsadiag.finding.trial import trial_finding
from nsadiag.recordspec import RecordSpec
from nsadiag.rundir import TrialRecord, keep_finding, load_records, read_json
from nsadiag.runmeta import RunMeta
from nsadiag.sweep import Fit, SweepRow, analyse, first_failure, fit_quantity, row_from_record
from nsadiag.verdict.thresholds import FASTER_THAN_SAVED

PREDICT_FACTORS = (2, 4)
"""sweep-seq predicts the peak at these multiples of its longest OK length."""
ROOT_ROUNDING = 1e-6
"""How far above a whole number a fitted root may lie and still be read as it: np.roots
returns 10.000000000002 for a line that reaches the limit at exactly 10."""


def _layers(n: int | None) -> str:
    if not n:
        return "the target's default depth"
    return f"{n} layer" + ("s" if n != 1 else "")


def row_item(row: SweepRow, unit: str = "layers") -> Item:
    """One trial as one line: its point, verdict, step time (against its expected cost
    when that means something) and peak."""
    point = _layers(row.n_layers) if unit == "layers" else f"S={row.seq_len}"
    kind = f" ({kind_of(row.verdict, row.slow_by)})" if row.verdict == "SLOW" else ""
    parts = [f"{point}: {row.verdict}{kind}"]
    if row.step_s is not None:
        ratio = cost_ratio(row.expected_step_s, row.cost_ratio)
        parts.append(f"step {sig(row.step_s)} s" + (f" ({sig(ratio)}x its expected cost)"
                                                    if ratio is not None else ""))
    peak = row.peak_cuda if row.peak_cuda is not None else row.peak_rss
    if peak:
        parts.append(f"peak {size(peak)}")
    text = ", ".join(parts)
    return fail(text) if row.failure else warn(text) if row.verdict != "OK" else ok(text)


def fit_items(fits: Mapping[str, Fit], per: str = "layer") -> tuple[list[Item], list[Item]]:
    """(ruled out, implicated) by the step-time and peak fits: linear growth rules a
    blow-up out, super-linear growth implicates; a poor fit says nothing."""
    ruled_out: list[Item] = []
    implicated: list[Item] = []
    for quantity, what, unit in (("step_s", "step time", "s"), ("peak_rss", "peak memory",
                                                                "B")):
        fit = fits.get(quantity)
        if fit is None or fit.poor:
            continue
        slope = f"{sig(fit.slope)} s" if unit == "s" else size(fit.slope)
        if fit.super_linear:
            implicated.append(fail(f"{what.capitalize()} grows faster than linearly with "
                                   f"{per}s (quadratic term {sig(fit.curvature)})."))
        else:
            ruled_out.append(ok(f"A {what} blow-up: it grows {slope} per {per}, on a line "
                                f"(R² {fit.r2:.2f})."))
    return ruled_out, implicated


def growth_items(growth: Mapping[str, Any] | None, per: str = "layers"
                 ) -> tuple[list[Item], list[Item]]:
    """(ruled out, implicated) by how the peak's parts grew."""
    if not growth:
        return [], []
    span = f"from {growth['from']} to {growth['to']} {per}"
    if growth["outgrows"]:
        return [], [fail(f"The peak outgrows what is saved for backward: {span} the rest of "
                         f"the peak grew {sig(growth['rest'])}x, the saved bytes "
                         f"{sig(growth['saved'])}x (a temporary or a cache sets the peak; "
                         f"`nsadiag memory` names the module).")]
    return [ok(f"A peak outgrowing the activations: {span} the saved bytes grew "
               f"{sig(growth['saved'])}x, the rest of the peak {sig(growth['rest'])}x.")], []


@dataclass
class SweepFacts:
    """What a sweep's fits say, for its finding: the fits of its main label, how the peak
    grew, and (sweep-seq) the predicted peaks and the cliff."""

    fits: Mapping[str, Fit] = field(default_factory=dict)
    growth: Mapping[str, Any] | None = None
    predicted: dict[int, float] = field(default_factory=dict)
    cliff: int | None = None
    memory: int | None = None


def sweep_finding(records: Sequence[TrialRecord], rows: Sequence[SweepRow], command: str,
                  facts: SweepFacts, rerun: list[str] | None = None) -> Finding:
    """The finding of a sweep's records (rows in the same order, every label) and what its
    fits say; ``rerun`` is the command of the smallest failing trial."""
    unit = "S" if command == "sweep-seq" else "layers"
    first = records[0].spec if records else RecordSpec()
    failing = first_failure(records) or next(
        (r for r in records if r.verdict_name == "INCONCLUSIVE"), None)
    points = sorted({r.seq_len if unit == "S" else r.n_layers for r in rows
                     if (r.seq_len if unit == "S" else r.n_layers) is not None})
    span = (f"S={points[0]}…{points[-1]}" if unit == "S" and len(points) > 1 else
            f"layers {points[0]}-{points[-1]}" if len(points) > 1 else
            (f"S={points[0]}" if unit == "S" else _layers(points[0])) if points else "nothing")
    subject = f"{first.target or 'nsa'}, {span}" + (
        f", S={first.seq_len}" if unit == "layers" and first.seq_len else
        f", {_layers(first.n_layers)}" if unit == "S" and first.n_layers else "")
    results = [row_item(r, unit) for r in rows]
    ruled_out, implicated = fit_items(facts.fits, "token" if unit == "S" else "layer")
    more_out, more_in = growth_items(facts.growth, "tokens" if unit == "S" else "layers")
    ruled_out += more_out
    implicated += more_in
    cliff = cliff_sentence(facts, unit)
    if cliff:
        (implicated if facts.cliff and facts.predicted else ruled_out).append(
            fail(cliff) if facts.cliff else ok(cliff))
    ok_rows = [r for r in rows if r.verdict == "OK"]
    if ok_rows:
        best = max(ok_rows, key=lambda r: (r.seq_len or 0) if unit == "S" else r.n_layers)
        point = f"S={best.seq_len}" if unit == "S" else _layers(best.n_layers)
        ruled_out.insert(0, ok(f"A failure at {point} or less: {len(ok_rows)} trial(s) "
                               f"finished every step."))
    if failing is not None:
        found = trial_finding(failing, command, None)
        point = (f"S={failing.spec.seq_len}" if unit == "S" else
                 _layers(failing.spec.n_layers or 0))
        where = f" — {found.culprit.where()}" if found.culprit and found.culprit.line else ""
        action = found.next_action + (f" Reproduce it alone: `{' '.join(rerun)}`."
                                      if rerun else "")
        return Finding(command=command, verdict=found.verdict, kind=found.kind,
                       status=found.status,
                       headline=f"{found.verdict} ({found.kind}) at {point}{where}",
                       subject=subject, next_action=action, culprit=found.culprit,
                       proof=found.proof,
                       summary=[f"{len(records)} trial(s); the first failure is {point}: "
                                f"{found.verdict} ({found.kind})."] + found.summary[1:]
                       + ([cliff] if cliff else []),
                       results=results, ruled_out=ruled_out + found.ruled_out,
                       implicated=found.implicated + implicated)
    big = next((r for r in rows if r.slow_by == "size"), None)
    step = facts.fits.get("step_s")
    trend = (f"step time {sig(step.slope)} s per {'token' if unit == 'S' else 'layer'}, "
             f"{step.growth()} (R² {step.r2:.2f}, {step.points} points)"
             if step and not step.poor else None)
    if big is not None:
        point = f"S={big.seq_len}" if unit == "S" else _layers(big.n_layers)
        return Finding(command=command, verdict="SLOW", kind="slow by size",
                       status="healthy",
                       headline=f"SLOW (slow by size) from {point}: no failure",
                       subject=subject,
                       next_action="Nothing is broken: a longer --budget or fewer --steps "
                                   "lets the larger trials finish.",
                       proof=next((i.text for i in results if "slow by size" in i.text),
                                  None),
                       summary=[f"{len(records)} trial(s), none failed: from {point} the "
                                f"work itself outlasts the budget (no host read per token, "
                                f"no loop of tiny ops)."] + ([cliff] if cliff else []),
                       results=results, ruled_out=ruled_out, implicated=implicated)
    last = "none" if not points else f"S={points[-1]}" if unit == "S" else \
        _layers(points[-1])
    return Finding(command=command, verdict="OK", kind="healthy", status="healthy",
                   headline=f"OK (healthy): every trial OK up to {last}", subject=subject,
                   next_action="Nothing failed here: if the full run still stops, sweep its "
                               "own configuration (sequence length, dtype, world size) or "
                               "run `nsadiag triage` on it.",
                   proof=trend or _ok_proof(rows, facts, unit),
                   summary=[f"{len(records)} trial(s), every one OK."] +
                   ([trend[:1].upper() + trend[1:] + "."] if trend else []) +
                   ([cliff] if cliff else []),
                   results=results, ruled_out=ruled_out, implicated=implicated)


# ---- sweep-seq: fits against S and the memory cliff ----------------------------------------------


def _rest(row: SweepRow) -> int | None:
    if row.peak_rss is None or row.saved_bytes is None:
        return None
    return max(0, row.peak_rss - row.saved_bytes)


def analyse_seq(rows: Sequence[SweepRow], memory: int) -> SweepFacts:
    """Fits of step time, peak RSS, saved bytes and the rest against S over the OK rows,
    the predicted peak at PREDICT_FACTORS x the longest OK length, how the peak's parts
    grew, and the cliff: the length where the fitted peak reaches ``memory`` bytes."""
    ok_rows = sorted((r for r in rows if r.verdict == "OK" and r.seq_len),
                     key=lambda r: r.seq_len)
    xs = [r.seq_len for r in ok_rows]
    targets = [factor * xs[-1] for factor in PREDICT_FACTORS] if xs else []
    values = {"step_s": [r.step_s for r in ok_rows], "peak_rss": [r.peak_rss for r in ok_rows],
              "saved_bytes": [r.saved_bytes for r in ok_rows],
              "rest": [_rest(r) for r in ok_rows]}
    fits: dict[str, Fit] = {}
    for quantity, ys in values.items():
        pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        fit = fit_quantity(quantity, [p[0] for p in pairs], [p[1] for p in pairs], targets)
        if fit is not None:
            fits[quantity] = fit
    growth = None
    saved, rest = values["saved_bytes"], values["rest"]
    if len(ok_rows) >= 2 and saved[0] and saved[-1] and rest[0] and rest[-1]:
        growth = {"from": xs[0], "to": xs[-1], "saved": saved[-1] / saved[0],
                  "rest": rest[-1] / rest[0]}
        growth["outgrows"] = growth["rest"] > FASTER_THAN_SAVED * growth["saved"]
    peak = fits.get("peak_rss")
    cliff = None
    if peak is not None and not peak.poor:
        cliff = crossing([r.seq_len for r in ok_rows if r.peak_rss],
                         [r.peak_rss for r in ok_rows if r.peak_rss], peak.super_linear,
                         memory)
    return SweepFacts(fits=fits, growth=growth,
                      predicted=dict(peak.extrapolated) if peak is not None else {},
                      cliff=cliff, memory=memory)


def crossing(xs: Sequence[int], ys: Sequence[float], quadratic: bool, limit: float
             ) -> int | None:
    """The smallest whole x beyond the last one at which the least-squares line (or
    parabola) of ys against xs has reached ``limit``: the first size that runs out, so a
    fitted root of 10.5 is 11 (at 10 the fit is still below the limit); None when it never
    does."""
    import numpy as np

    coefficients = np.polyfit(np.asarray(xs, float), np.asarray(ys, float),
                              2 if quadratic else 1)
    coefficients[-1] -= limit
    roots = [r.real for r in np.roots(coefficients) if abs(r.imag) < 1e-9 and r.real > xs[-1]]
    if not roots:
        return None
    # a root that is a whole number up to the fit's rounding (10.000000001) is that number
    return math.ceil(min(roots) - ROOT_ROUNDING)


def cliff_sentence(facts: SweepFacts, unit: str = "S") -> str | None:
    """The predicted peaks and where the memory runs out, in one sentence."""
    if not facts.predicted or not facts.memory:
        return None

    def point(x: int) -> str:
        return f"S={x:,}" if unit == "S" else _layers(x)

    peaks = ", ".join(f"{size(v)} at {point(x)}" for x, v in facts.predicted.items())
    if facts.cliff:
        return (f"Predicted peak {peaks}: this machine's {size(facts.memory)} run out near "
                f"{point(facts.cliff)}.")
    return f"Predicted peak {peaks}, within this machine's {size(facts.memory)}."


def _ok_proof(rows: Sequence[SweepRow], facts: SweepFacts, unit: str) -> str:
    """What proves a healthy sweep when the step time follows no clear line (a loaded
    machine's timings): how many trials finished, the deepest step, and the peak's growth
    when it follows one."""
    ok_rows = [r for r in rows if r.verdict == "OK"]
    last = max(ok_rows, key=lambda r: (r.seq_len or 0) if unit == "S" else r.n_layers,
               default=None)
    text = f"{len(ok_rows)} of {len(rows)} trials finished every step"
    if last is not None and last.step_s is not None:
        point = f"S={last.seq_len}" if unit == "S" else _layers(last.n_layers)
        text += f", {point} in {sig(last.step_s)} s a step"
    peak = facts.fits.get("peak_rss")
    if peak is not None and not peak.poor:
        per = "token" if unit == "S" else "layer"
        text += f"; the peak grows {size(peak.slope)} per {per}, {peak.growth()}"
    return text


def layer_facts(rows: Sequence[SweepRow], fits: Mapping[str, Fit],
                growth: Mapping[str, Any] | None, memory: int) -> SweepFacts:
    """What a layer sweep's fits say: the predicted peak at the next counts and the layer
    count where the fitted peak reaches ``memory`` bytes (the cliff)."""
    peak = fits.get("peak_rss")
    ok_rows = sorted((r for r in rows if r.verdict == "OK" and r.peak_rss),
                     key=lambda r: r.n_layers)
    cliff = None
    if peak is not None and not peak.poor and len(ok_rows) >= 2:
        cliff = crossing([r.n_layers for r in ok_rows], [r.peak_rss for r in ok_rows],
                         peak.super_linear, memory)
    return SweepFacts(fits=fits, growth=growth,
                      predicted=dict(peak.extrapolated) if peak is not None else {},
                      cliff=cliff, memory=memory)


# ---- a sweep's measurements, and its finding decided once ------------------------------------


@dataclass
class SweepAnalysis:
    """What a sweep's trials measured, for its finding and its report: the records in the
    sweep's order, the trials by label (rows), each label's fits, what the main label's
    fits predict, and the failing trial."""

    command: str
    records: list[TrialRecord]
    groups: dict[str, list[SweepRow]]
    fits: dict[str, dict[str, Fit]]
    facts: SweepFacts
    failing: TrialRecord | None

    @property
    def rows(self) -> list[SweepRow]:
        return [row for rows in self.groups.values() for row in rows]


def failing_record(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The trial a sweep's report is about: the first failure, else the first
    INCONCLUSIVE."""
    return first_failure(records) or next(
        (r for r in records if r.verdict_name == "INCONCLUSIVE"), None)


def measure_layer_sweep(records: Sequence[TrialRecord], labels: Mapping[str, str],
                        command: str, memory: int) -> SweepAnalysis:
    """The measurements of a layer sweep: ``labels`` maps a trial directory's name to its
    run's label (isolate-branch: "all branches", "<branch> only"), the command's name
    otherwise; ``memory`` is the machine's, for the predicted cliff."""
    records = sorted(records, key=lambda r: r.spec.n_layers or 0)
    groups: dict[str, list[SweepRow]] = {}
    for record in records:
        label = labels.get(Path(record.trial_dir).name) or command
        groups.setdefault(label, []).append(row_from_record(record, label))
    analyses = {label: analyse(rows) for label, rows in groups.items()}
    main = next(iter(analyses.values()), {"fits": {}, "memory_growth": None})
    facts = layer_facts(next(iter(groups.values()), []), main["fits"], main["memory_growth"],
                        memory)
    return SweepAnalysis(command, records, groups,
                         {label: a["fits"] for label, a in analyses.items()}, facts,
                         failing_record(records))


def measure_seq_sweep(records: Sequence[TrialRecord], memory: int) -> SweepAnalysis:
    """The measurements of a sweep over S (one label, "sweep-seq")."""
    records = sorted(records, key=lambda r: r.spec.seq_len or 0)
    rows = [row_from_record(record, "sweep-seq") for record in records]
    facts = analyse_seq(rows, memory)
    return SweepAnalysis("sweep-seq", records, {"sweep-seq": rows},
                         {"sweep-seq": dict(facts.fits)}, facts, failing_record(records))


def measure_sweep(kind: str, records: Sequence[TrialRecord], meta: RunMeta, memory: int
                  ) -> SweepAnalysis:
    """The measurements of a sweep run directory of ``kind`` (sweep-layers, isolate-branch,
    sweep-seq): its records, labelled by its run.json (``meta``)."""
    if kind == "sweep-seq":
        return measure_seq_sweep(records, memory)
    labels = {Path(r.trial_dir).name: meta.label_of(Path(r.trial_dir).name)
              for r in records}
    return measure_layer_sweep(records, labels, meta.command_name or kind, memory)


def decide_sweep(measured: SweepAnalysis) -> Finding:
    """The finding of a sweep from its measurements (decided once: by the sweep command as
    it ends, or for a run directory that kept none, as its report is rendered)."""
    failing = measured.failing
    return sweep_finding(measured.records, measured.rows, measured.command, measured.facts,
                         reproduce(failing.spec) if failing else None)


def keep_sweep_finding(run_dir: Path, kind: str) -> Finding:
    """Decide the finding of the sweep in ``run_dir`` (its trials.jsonl and run.json) as
    the sweep ends, and keep it in the run directory's finding.json with this machine's
    memory, which its cliff was decided against; ValueError (one line) when the directory
    holds no finished trial."""
    import psutil

    records = load_records(run_dir / "trials.jsonl")
    if not records:
        raise ValueError(f"run_dir: no trials.jsonl with finished trials in {run_dir}")
    path = run_dir / "run.json"
    meta = RunMeta.from_dict(read_json(path, "run.json") if path.exists() else {})
    memory = psutil.virtual_memory().total
    finding = decide_sweep(measure_sweep(kind, records, meta, memory))
    keep_finding(run_dir, finding, machine_memory=memory)
    return finding
