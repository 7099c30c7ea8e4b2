"""nsadiag triage: from "it hangs" to a minimal failing configuration, within a time limit.

Stages, in order (each stores what it learnt in <run_dir>/triage.json before the next):

1. env      collect_env() and the problems that weaken the evidence (no py-spy, ...)
   checks   nsadiag.checks causality, parity, ckpt (and ddp with world_size > 1) at
            min(2, max_layers) layers; a check ending WRONG, ERROR, CRASH, OOM or in a
            stall is a failure, one cut short by its time budget (SLOW) is reported as not
            finished and decides nothing; checks are not resumed: a rerun runs them again
2. sweep    the layer threshold: trials at 1, 2, 4, ... layers, then binary search
            between the deepest OK count and the first non-OK one (nsadiag.triage.decide)
3. on a non-OK verdict at the threshold:
   repeats      the failing configuration again, until the verdicts agree or 3 ran
   attribution  where the failing trial's time went, from its heartbeat events
   branches     for NSA targets: each branch alone at the threshold depth
   bisection    delta debugging of the knobs that differ from the healthy baseline
                (grad_ckpt, dtype, backend, branches, seq_len, world_size) to a 1-minimal
                failing set; world_size > 1 runs the trial under torchrun (nsadiag ddp)
4. report   triage.json is redacted like the report (unless no_redact): it is meant to be
            shared, and a rerun resumes from trials.jsonl, not from it; then the finding
            (nsadiag.triage.finding), decided once from the state as stored and kept in
            finding.json, and report.md and summary.json (nsadiag.report.triage) around it,
            optionally compared with a baseline summary.json for regressions in step time
            and peak memory. A rerun drops the kept finding as it starts.

Time: the whole triage stays inside ``max_minutes``. Each trial gets the planned budget
(``plan_trial_budget``) or what is left; when not even a minimal trial fits, the triage
stops and the report says what is known and what was not reached. A trial cut short by the
limit that ends SLOW only says the time ran out, and a trial whose budget ran out before
training started says nothing; either stops the triage as well.

Resuming: trials are appended to trials.jsonl; a rerun with the same options in the same
run directory takes finished trials from there (the n-th run of a configuration reuses the
n-th stored record) and continues where the last run stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsadiag.ci import write_step_summary
from nsadiag.compare import DEFAULT_THRESHOLD, load_summary
from nsadiag.preflight import check_ddp, check_target
from nsadiag.redact import redact_obj
from nsadiag.report.dispatch import Rendered, render_run, stored_meta
from nsadiag.rundir import (
    forget_finding,
    prepare_run_dir,
    read_json,
    write_json,
    write_run_meta,
    write_text,
)
from nsadiag.spec import TrialSpec
from nsadiag.triage.engine import Triage, TriageCallbacks, TriageOptions
from nsadiag.triage.finding import keep_triage_finding
from nsadiag.triage.state import Regression

__all__ = ["TriageCallbacks", "TriageOptions", "TriageOutcome", "triage"]


@dataclass
class TriageOutcome:
    """What a finished triage left: what the report wrote, its summary and the exit code
    (nsadiag.ci); the step summary file it appended to, if any."""

    report: Rendered
    summary: dict[str, Any]
    exit_code: int
    step_summary: Path | None = None


def triage(base: TrialSpec, options: TriageOptions, run_dir: Path, argv: Sequence[str],
           callbacks: TriageCallbacks | None = None, baseline: Path | None = None,
           regression_threshold: float = DEFAULT_THRESHOLD, ci: bool = False,
           clock: Callable[[], float] = time.monotonic) -> TriageOutcome:
    """Check the inputs, run the triage in ``run_dir``, write report.md and summary.json.

    Everything a user can get wrong (options, target, baseline file, run directory) raises
    ValueError with one line before any trial runs. With ``baseline`` (a summary.json or a
    run directory) the OK trials are compared with its rows; ``ci`` also appends the report
    to $GITHUB_STEP_SUMMARY when that is set.
    """
    options.validate()
    if options.world_size > 1:
        check_ddp(base, options.world_size, options.ddp_backend)
    if not regression_threshold >= 0:
        raise ValueError(f"regression-threshold: must be >= 0, got {regression_threshold!r}")
    baseline_rows = load_summary(baseline)["rows"] if baseline is not None else None
    check_target(base.replace(n_layers=options.max_layers))
    prepare_run_dir(run_dir)
    if callbacks is not None and callbacks.on_plan:
        callbacks.on_plan()
    meta = {k: v for k, v in stored_meta(run_dir).items()
            if k not in ("schema_version", "command_name", "argv")}
    write_run_meta(run_dir, "triage", list(argv), **meta)
    write_text(run_dir / "spec.json", base.to_json())
    forget_finding(run_dir)  # a rerun adds to the trials: it keeps its own as it ends
    runner = Triage(base, options, run_dir, argv, callbacks, clock)
    try:
        state = runner.run()
        if baseline_rows is not None:
            state.regression = Regression(str(baseline), regression_threshold, baseline_rows)
            write_json(run_dir / "triage.json", state.to_dict())
    finally:  # redacted before the report is made from it, so a re-render gives the same
        if not options.no_redact and (run_dir / "triage.json").exists():
            write_json(run_dir / "triage.json",
                       redact_obj(read_json(run_dir / "triage.json", "triage.json")))
    keep_triage_finding(run_dir)
    rendered = render_run(run_dir, options.no_redact)
    step_summary = write_step_summary(rendered.report.read_text()) if ci else None
    return TriageOutcome(rendered, rendered.summary, rendered.exit_code, step_summary)
