"""Layer sweeps: one watched trial per layer count, then fits of time and memory.

`run_sweep` runs the trials in order, appending each record to `trials.jsonl` (fsynced)
before the next starts; a rerun in the same run directory skips the layer counts already
recorded for the same spec. The sweep stops after the first non-OK trial unless asked to
keep going: that count is the threshold, and the trials above it would only repeat it.

`row_from_record` reduces a trial to one row: step, forward and backward times are
medians of the steps after step 0 (which pays one-off costs), and the row says how many
steps each median covers (trials run timing steps up to three where the budget allows);
the peak is split into what step 0's forward saved for backward and the rest (autograd
and temporary scratch, the model and the optimizer); the step time is set against its
expected cost (nsadiag.probes.efficiency.step_cost); a SLOW row says whether it is slow
by size or by defect.

`analyse` turns rows into fits: least squares of step time, forward time, backward time
and peak memory against the layer count (three counts at least), with the slope's standard
error, extrapolated to the next counts, and a flag when growth is super-linear (a quadratic
term that explains most of the linear fit's error). A poor fit (R² below 0.9, or a slope
within two standard errors of zero) claims no growth law and extrapolates nothing. It also
says whether the rest of the peak grows much faster than the saved bytes
(``rest_outgrows_saved``), and the threshold is the first failure: a SLOW by size is the
work outlasting the budget, not a failure (``is_failure``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nsadiag.harness.jobs import TrialInterrupted, run_trial
from nsadiag.probes.efficiency import step_cost
from nsadiag.rundir import TrialRecord, append_record, load_records, next_trial_index, spec_key
from nsadiag.spec import TrialSpec
from nsadiag.verdict import is_failure
from nsadiag.verdict.thresholds import (
    FASTER_THAN_SAVED,
    GOOD_R2,
    SLOPE_STANDARD_ERRORS,
    SUPER_LINEAR_ABOVE,
    SUPER_LINEAR_RESIDUAL,
)


@dataclass
class SweepRow:
    """One layer count: its verdict and the medians of its measured steps (None when the
    trial did not complete a step) over ``timed_steps`` steps; saved_bytes and
    saved_by_branch are what step 0's forward saved for backward, in all and inside each
    NSA branch, ``state_bytes`` the training state (parameters, gradients, optimizer
    state), ``rest_bytes`` the rest of the peak: the peak less the saved bytes and the
    state, i.e. autograd and temporary scratch (the peak is ``peak_cuda``, torch's peak of
    allocated CUDA memory, on a CUDA device, where the tensors live; the peak RSS
    elsewhere; a record without state_bytes leaves the state in the rest);
    ``expected_step_s`` is the dense
    reference's time here for a step's FLOPs and ``cost_ratio`` the step time over it;
    ``slow_by`` is "size" or "defect" for a SLOW, else None."""

    label: str
    n_layers: int
    verdict: str
    forward_s: float | None
    backward_s: float | None
    step_s: float | None
    peak_rss: int | None
    saved_bytes: int | None
    steps_done: int
    trial_dir: str
    saved_by_branch: dict[str, int] | None = None  # per NSA branch (cmp/sel/win), step 0
    step_s_spread: float | None = None  # (max - min) / median of the measured step times
    seq_len: int | None = None
    timed_steps: int = 0  # steps the medians cover
    rest_bytes: int | None = None  # the device's peak minus saved_bytes and state_bytes
    peak_cuda: int | None = None  # torch.cuda.max_memory_allocated() on CUDA, else None
    state_bytes: int | None = None  # parameters, gradients and optimizer state
    efficiency: float | None = None  # FLOP/s of the median step over the matmul rate
    dense_efficiency: float | None = None  # the dense reference's, same shape, same machine
    expected_step_s: float | None = None
    cost_ratio: float | None = None
    slow_by: str | None = None

    @property
    def failure(self) -> bool:
        """A failure found (nsadiag.verdict.is_failure): not OK, INCONCLUSIVE or slow by
        size."""
        return is_failure(self.verdict, self.slow_by)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


MIN_FIT_POINTS = 3
"""Two points always lie on a line (R² 1): a fit needs at least three."""


@dataclass
class Callbacks:
    """How a front end follows a sweep (all optional): the inputs are checked and the
    first trial is about to start (``on_plan``), a trial starts (its point and spec),
    heartbeat events arrive, a trial's record is written."""

    on_trial: Callable[[int, TrialSpec], None] | None = None
    on_events: Callable[[list[dict]], None] | None = None
    on_record: Callable[[TrialRecord], None] | None = None
    on_plan: Callable[[], None] | None = None


@dataclass
class Fit:
    """y = slope * layers + intercept (``slope_se`` its standard error, ``points`` how many
    layer counts), with the quadratic check for super-linear growth. A ``poor`` fit says
    nothing about growth and extrapolates nothing."""

    quantity: str
    slope: float
    intercept: float
    r2: float
    curvature: float  # coefficient of layers^2 in the quadratic fit
    super_linear: bool
    extrapolated: dict[int, float] = field(default_factory=dict)
    slope_se: float = 0.0
    points: int = 0
    poor: bool = False

    def growth(self) -> str:
        """"super-linear", "linear" or "no clear trend" (a poor fit)."""
        if self.poor:
            return "no clear trend"
        return "super-linear" if self.super_linear else "linear"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_seq_lens(text: str) -> list[int]:
    """"512,1024,2048" -> ascending unique positive sequence lengths."""
    try:
        lengths = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise ValueError(f"seq-lens: expected lengths like 512,1024,2048, got {text!r}") \
            from None
    if not lengths or min(lengths) < 1:
        raise ValueError(f"seq-lens: lengths must be positive, got {text!r}")
    return sorted(lengths)


MAX_PARSED_LAYER_COUNTS = 10**6
"""A layer range naming more counts than this is refused while it is read (no list of
billions is built); nsadiag.limits refuses far fewer, unless told not to."""


def parse_layers(text: str) -> list[int]:
    """"1-12", "1,2,4,8", "2-12:2" -> ascending unique positive layer counts."""
    counts: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        span, _, step = part.partition(":")
        low, dash, high = span.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
            stride = int(step) if step else 1
        except ValueError:
            raise ValueError(f"layers: expected a range like 1-12, 1,2,4 or 2-12:2, "
                             f"got {text!r}") from None
        if first < 1 or last < first or stride < 1:
            raise ValueError(f"layers: counts must be positive and ranges ascending, got "
                             f"{part!r}")
        # counted in Python integers: len() of a range past 2**63 raises OverflowError
        if len(counts) + (last - first) // stride + 1 > MAX_PARSED_LAYER_COUNTS:
            raise ValueError(f"layers: {text!r} names more than {MAX_PARSED_LAYER_COUNTS} "
                             f"layer counts")
        counts.update(range(first, last + 1, stride))
    if not counts:
        raise ValueError(f"layers: no layer count in {text!r}")
    return sorted(counts)


RATE_FIELDS = ("flops_per_step", "machine_flops_per_s", "dense_efficiency", "efficiency")


def _result_or_events(record: TrialRecord) -> dict[str, Any]:
    """The child's result, or for a trial killed before writing one, the same timings
    rebuilt from its "step" heartbeat events (and the saved bytes from step 0's
    "backward" start event)."""
    evidence = record.evidence
    if evidence is not None and evidence.result:
        return evidence.result
    events = evidence.events if evidence is not None else []
    steps = [e for e in events if e.get("kind") == "step"]
    rebuilt: dict[str, Any] = {key: [e[key] for e in steps if key in e]
                               for key in ("step_s", "forward_s", "backward_s")}
    asked = record.spec.steps or 0
    rebuilt["steps_done"] = min(steps[-1]["step"] + 1, asked or steps[-1]["step"] + 1) \
        if steps else 0
    rebuilt.update({key: steps[-1].get(key) for key in RATE_FIELDS} if steps else {})
    rss = [e["rss"] for e in events if e.get("rss")]
    rebuilt["peak_rss"] = max(rss) if rss else None
    saved = next((e for e in events if e.get("kind") == "start"
                  and e.get("phase") == "backward" and "saved_bytes" in e), {})
    rebuilt["saved_bytes"] = saved.get("saved_bytes")
    rebuilt["saved_by_branch"] = saved.get("saved_by_branch")
    return rebuilt


def row_from_record(record: TrialRecord, label: str = "") -> SweepRow:
    result = _result_or_events(record)

    def measured(key: str) -> list[float]:
        values = result.get(key) or []
        # the first step pays one-off costs (allocator warm-up, lazy init): drop it if possible
        return values[1:] if len(values) > 1 else values

    def median(key: str) -> float | None:
        values = measured(key)
        return statistics.median(values) if values else None

    def spread(key: str) -> float | None:
        values = measured(key)
        middle = statistics.median(values) if len(values) >= 2 else 0.0
        return (max(values) - min(values)) / middle if middle > 0 else None

    peak_cuda = result.get("peak_cuda")
    peak, saved, step_s = result.get("peak_rss"), result.get("saved_bytes"), median("step_s")
    device_peak = peak_cuda if peak_cuda is not None else peak
    state = result.get("state_bytes")
    cost = step_cost(result, step_s)
    facts = record.verdict.facts
    return SweepRow(label=label, n_layers=record.spec.n_layers or 0,
                    verdict=record.verdict_name, forward_s=median("forward_s"),
                    backward_s=median("backward_s"), step_s=step_s,
                    peak_rss=peak, saved_bytes=saved,
                    steps_done=int(result.get("steps_done", 0)),
                    trial_dir=record.trial_dir,
                    saved_by_branch=result.get("saved_by_branch"),
                    step_s_spread=spread("step_s"), seq_len=record.spec.seq_len,
                    timed_steps=len(measured("step_s")),
                    rest_bytes=max(0, device_peak - saved - (state or 0))
                    if device_peak is not None and saved is not None else None,
                    peak_cuda=peak_cuda, state_bytes=state,
                    efficiency=(result["flops_per_step"] / step_s /
                                result["machine_flops_per_s"]) if cost else
                    result.get("efficiency"),
                    dense_efficiency=result.get("dense_efficiency"),
                    expected_step_s=cost["expected_s"] if cost else None,
                    cost_ratio=cost["ratio"] if cost else None,
                    slow_by=facts.slow.slow_by if record.verdict_name == "SLOW" else None)



def run_sweep(base: TrialSpec, points: Sequence[int], run_dir: Path, label: str = "",
              keep_going: bool = False,
              on_trial: Callable[[int, TrialSpec], None] | None = None,
              on_events: Callable[[list[dict]], None] | None = None,
              on_record: Callable[[TrialRecord], None] | None = None,
              vary: str = "n_layers") -> list[TrialRecord]:
    """Run (or resume) one trial per point of the ``vary`` field (layer counts, or
    sequence lengths with vary="seq_len"); returns the records in the order run."""
    trials_path = run_dir / "trials.jsonl"
    # an interrupted trial is kept for its report, and run again on a resume
    done = {spec_key(r.spec.to_dict()): r for r in load_records(trials_path)
            if r.evidence is None or not r.evidence.interrupted}
    records = []
    for point in points:
        trial_dir = run_dir / f"trial-{next_trial_index(run_dir)}"
        spec = base.replace(**{vary: point}, out_dir=str(trial_dir))
        key = spec_key(json.loads(spec.to_json()))
        if key in done:
            record = done[key]
        else:
            if on_trial:
                on_trial(point, spec)
            try:
                record = run_trial(spec, on_events=on_events)
            except TrialInterrupted as stopped:
                append_record(trials_path, stopped.record)
                raise
            append_record(trials_path, record)
        records.append(record)
        if on_record:
            on_record(record)
        if record.verdict_name != "OK" and not keep_going:
            break
    return records


def _least_squares(xs: Sequence[float], ys: Sequence[float], degree: int) -> list[float]:
    """Polynomial coefficients (highest power first) by normal equations; len(xs) > degree."""
    import numpy as np

    return [float(c) for c in np.polyfit(np.asarray(xs, float), np.asarray(ys, float), degree)]


def fit_quantity(quantity: str, xs: Sequence[int], ys: Sequence[float],
                 extrapolate_to: Sequence[int]) -> Fit | None:
    """Linear fit of ys against layer counts; None with fewer than MIN_FIT_POINTS distinct
    counts."""
    if len(set(xs)) < MIN_FIT_POINTS:
        return None
    slope, intercept = _least_squares(xs, ys, 1)
    predicted = [slope * x + intercept for x in xs]
    mean = statistics.fmean(ys)
    ss_tot = sum((y - mean) ** 2 for y in ys)
    ss_lin = sum((y - p) ** 2 for y, p in zip(ys, predicted, strict=True))
    r2 = 1.0 - ss_lin / ss_tot if ss_tot > 0 else 1.0
    x_mean = statistics.fmean(xs)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    slope_se = (ss_lin / (len(xs) - 2) / sxx) ** 0.5 if len(xs) > 2 else 0.0
    poor = r2 < GOOD_R2 or abs(slope) <= SLOPE_STANDARD_ERRORS * slope_se
    a = b = c = 0.0
    curvature, super_linear = 0.0, False
    if len(xs) >= 4:
        a, b, c = _least_squares(xs, ys, 2)
        ss_quad = sum((y - (a * x * x + b * x + c)) ** 2 for x, y in zip(xs, ys, strict=True))
        curvature = a
        # growing faster than linear: positive curvature that removes most of the residual,
        # and a last point well above the line through the earlier ones
        super_linear = bool(a > 0 and ss_lin > 0 and ss_quad < SUPER_LINEAR_RESIDUAL * ss_lin
                            and ys[-1] > SUPER_LINEAR_ABOVE * predicted[-1])
    fit = Fit(quantity, slope, intercept, r2, curvature, super_linear and not poor,
              slope_se=slope_se, points=len(xs), poor=poor)
    if not poor:
        for x in extrapolate_to:
            fit.extrapolated[x] = ((a * x * x + b * x + c) if fit.super_linear
                                   else slope * x + intercept)
    return fit


def rest_outgrows_saved(rows: Sequence[SweepRow], key: str = "n_layers"
                        ) -> dict[str, Any] | None:
    """How the saved bytes, the rest of the peak and the peak grew from the first to the
    last OK row (ordered by ``key``), as ratios, and ``outgrows``: the rest grew more than
    FASTER_THAN_SAVED times as fast as the saved bytes (a temporary or a cache that grows
    faster than the activations sets the peak); None with fewer than two such rows."""
    def peak(row: SweepRow) -> int | None:  # the device's: CUDA's when it was measured
        return row.peak_cuda if row.peak_cuda is not None else row.peak_rss

    ok = sorted((r for r in rows if r.verdict == "OK" and getattr(r, key) and r.saved_bytes
                 and r.rest_bytes and peak(r)), key=lambda r: getattr(r, key))
    if len(ok) < 2 or getattr(ok[0], key) == getattr(ok[-1], key):
        return None
    first, last = ok[0], ok[-1]
    growth = {"from": getattr(first, key), "to": getattr(last, key),
              "saved": last.saved_bytes / first.saved_bytes,
              "rest": last.rest_bytes / first.rest_bytes,
              "peak": peak(last) / peak(first)}
    growth["outgrows"] = growth["rest"] > FASTER_THAN_SAVED * growth["saved"]
    return growth


def first_failure(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The first record that is a failure found (nsadiag.verdict.is_failure)."""
    return next((r for r in records if is_failure(
        r.verdict_name, r.slow_by)), None)


def analyse(rows: Sequence[SweepRow], extrapolate_count: int = 2) -> dict[str, Any]:
    """Fits over the OK rows, the threshold (first failing count: not OK, INCONCLUSIVE or
    slow by size), the first count slow by size, the growth flags, and how the peak's
    parts grew (``rest_outgrows_saved``)."""
    rows = sorted(rows, key=lambda r: r.n_layers)
    ok = [r for r in rows if r.verdict == "OK"]
    xs = [r.n_layers for r in ok]
    step = max(1, xs[-1] - xs[-2]) if len(xs) >= 2 else 1
    targets = [xs[-1] + step * (i + 1) for i in range(extrapolate_count)] if xs else []
    fits = {}
    for quantity in ("step_s", "forward_s", "backward_s", "peak_rss", "peak_cuda",
                     "saved_bytes", "rest_bytes"):
        pairs = [(r.n_layers, getattr(r, quantity)) for r in ok if getattr(r, quantity)]
        fit = fit_quantity(quantity, [p[0] for p in pairs], [p[1] for p in pairs], targets)
        if fit:
            fits[quantity] = fit
    failing = next((r for r in rows if r.failure), None)
    big = next((r for r in rows if r.slow_by == "size"), None)
    return {"fits": fits, "threshold": failing.n_layers if failing else None,
            "threshold_verdict": failing.verdict if failing else None,
            "slow_by_size_from": big.n_layers if big else None,
            "super_linear": sorted(q for q, f in fits.items() if f.super_linear),
            "memory_growth": rest_outgrows_saved(rows)}
