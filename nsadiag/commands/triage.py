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
4. report   report.md and summary.json (nsadiag.triage_report), optionally compared with a
            baseline summary.json for regressions in step time and peak memory.

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

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsadiag.ci import exit_code, write_step_summary
from nsadiag.commands.ddp import check_ddp
from nsadiag.commands.sweep import check_target
from nsadiag.compare import DEFAULT_THRESHOLD, load_summary
from nsadiag.rundir import prepare_run_dir
from nsadiag.spec import TrialSpec
from nsadiag.triage.engine import Triage, TriageCallbacks, TriageOptions
from nsadiag.triage_report import render_triage

__all__ = ["TriageCallbacks", "TriageOptions", "TriageOutcome", "triage"]


@dataclass
class TriageOutcome:
    """What a finished triage left: the report, its summary and the exit code (nsadiag.ci)."""

    report: Path
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
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta.update(command_name="triage", argv=list(argv))
    meta_path.write_text(json.dumps(meta, indent=1))
    (run_dir / "spec.json").write_text(base.to_json())
    runner = Triage(base, options, run_dir, argv, callbacks, clock)
    state = runner.run()
    if baseline_rows is not None:
        state["regression"] = {"path": str(baseline), "threshold": regression_threshold,
                               "rows": baseline_rows}
        runner._save()
    report = render_triage(run_dir, options.no_redact)
    summary = json.loads((run_dir / "summary.json").read_text())
    step_summary = write_step_summary(report.read_text()) if ci else None
    return TriageOutcome(report, summary, exit_code(summary), step_summary)
