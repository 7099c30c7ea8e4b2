"""sweep-layers, sweep-seq and isolate-branch: sweeps in a run directory, then the report.

The commands check everything a user can get wrong before any trial starts (target,
factory knobs, layer range, limits, output directory) and raise ValueError with one line;
nothing is written to the run directory until those checks pass. A sweep the user
interrupts (Ctrl-C, SIGTERM, SIGHUP) renders its report from the trials it finished and
the one it interrupted before the command exits.

A sweep decides its finding once, when it ends (finished or interrupted), from every trial
its run directory holds, and keeps it in finding.json (nsadiag.finding.sweep
``keep_sweep_finding``) before the report lays it out; a rerun in the same directory
resumes, so it drops the kept finding as it starts and keeps a new one as it ends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from nsadiag.envinfo import collect_env
from nsadiag.finding.sweep import keep_sweep_finding
from nsadiag.harness import stop
from nsadiag.preflight import check_target
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.rundir import (
    TrialRecord,
    forget_finding,
    prepare_run_dir,
    read_json,
    record_redaction,
    write_json,
    write_text,
)
from nsadiag.schema import SCHEMA_VERSION
from nsadiag.spec import BRANCHES, TrialSpec
from nsadiag.sweep import Callbacks, run_sweep


def _write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    write_json(run_dir / "run.json", meta)


def _meta(run_dir: Path, command_name: str, argv: Sequence[str]) -> dict[str, Any]:
    path = run_dir / "run.json"
    meta = read_json(path, "run.json") if os.path.lexists(path) else {}
    if not isinstance(meta, dict):
        raise ValueError(f"run.json: {path} is not a JSON object")
    record_redaction(run_dir, argv)
    meta.update(schema_version=SCHEMA_VERSION, command_name=command_name, argv=list(argv),
                env=collect_env().as_dict())
    meta.setdefault("labels", {})
    return meta


@contextlib.contextmanager
def _kept_when_interrupted(run_dir: Path, kind: str) -> Iterator[None]:
    """A sweep the user interrupts keeps what it found: its finished trials and the
    interrupted one (nsadiag.sweep.run_sweep records it) decide its finding, kept in
    finding.json, and are rendered into report.md and summary.json; ``stop.Kept`` carries
    them to the command line."""
    try:
        yield
    except KeyboardInterrupt:
        if not (run_dir / "trials.jsonl").exists():
            raise
        try:
            rendered = _ended(run_dir, kind)
        except ValueError:
            raise KeyboardInterrupt from None
        raise stop.Kept(rendered) from None


def _ended(run_dir: Path, kind: str) -> Rendered:
    """The sweep has ended: decide its finding once from every trial in the run directory
    (a resumed sweep's earlier ones too), keep it, and render the report around it."""
    keep_sweep_finding(run_dir, kind)
    return render_run(run_dir)


def _started(run_dir: Path, meta: dict[str, Any], base: TrialSpec) -> None:
    """Write run.json and spec.json, and drop a finding kept by an earlier run in this
    directory: this sweep may add trials to it (a resume), and keeps its own as it ends."""
    _write_meta(run_dir, meta)
    write_text(run_dir / "spec.json", base.to_json())
    forget_finding(run_dir)


def _planned(callbacks: Callbacks | None) -> None:
    """Tell the front end the inputs are checked and the trials are about to start."""
    if callbacks is not None and callbacks.on_plan:
        callbacks.on_plan()


def _labelled_sweep(base: TrialSpec, points: Sequence[int], run_dir: Path, label: str,
                    meta: dict[str, Any], callbacks: Callbacks, keep_going: bool = False,
                    vary: str = "n_layers") -> list[TrialRecord]:
    def record_label(record: TrialRecord) -> None:
        meta["labels"][Path(record.trial_dir).name] = label
        _write_meta(run_dir, meta)
        if callbacks.on_record:
            callbacks.on_record(record)

    return run_sweep(base, points, run_dir, label=label, keep_going=keep_going,
                     on_trial=callbacks.on_trial, on_events=callbacks.on_events,
                     on_record=record_label, vary=vary)


def sweep_layers(base: TrialSpec, layers: Sequence[int], run_dir: Path, argv: Sequence[str],
                 callbacks: Callbacks | None = None, keep_going: bool = False) -> Rendered:
    """One trial per layer count until the first non-OK (every count with
    ``keep_going``); returns what the report wrote."""
    check_target(base.replace(n_layers=max(layers)))
    prepare_run_dir(run_dir)
    _planned(callbacks)
    meta = _meta(run_dir, "sweep-layers", argv)
    _started(run_dir, meta, base)
    with _kept_when_interrupted(run_dir, "sweep-layers"):
        _labelled_sweep(base, layers, run_dir, "", meta, callbacks or Callbacks(), keep_going)
    return _ended(run_dir, "sweep-layers")


def sweep_seq(base: TrialSpec, seq_lens: Sequence[int], run_dir: Path, argv: Sequence[str],
              callbacks: Callbacks | None = None, keep_going: bool = False) -> Rendered:
    """One trial per sequence length at ``base.n_layers`` until the first non-OK (every
    length with ``keep_going``); returns what the report wrote (nsadiag.report.seq)."""
    check_target(base.replace(seq_len=max(seq_lens)))
    prepare_run_dir(run_dir)
    _planned(callbacks)
    meta = _meta(run_dir, "sweep-seq", argv)
    _started(run_dir, meta, base)
    with _kept_when_interrupted(run_dir, "sweep-seq"):
        _labelled_sweep(base, seq_lens, run_dir, "", meta, callbacks or Callbacks(),
                        keep_going, vary="seq_len")
    return _ended(run_dir, "sweep-seq")


def isolate_branch(base: TrialSpec, branch: str, layers: Sequence[int], run_dir: Path,
                   argv: Sequence[str], callbacks: Callbacks | None = None) -> Rendered:
    """The sweep with all branches, then with only `branch` computed; returns what the
    report wrote."""
    if branch not in BRANCHES:
        raise ValueError(f"branch: must be one of {', '.join(BRANCHES)}, got {branch!r}")
    only = base.replace(branches=(branch,))
    check_target(only.replace(n_layers=max(layers)))
    prepare_run_dir(run_dir)
    _planned(callbacks)
    meta = _meta(run_dir, "isolate-branch", argv)
    meta["branch"] = branch
    _started(run_dir, meta, base)
    callbacks = callbacks or Callbacks()
    with _kept_when_interrupted(run_dir, "isolate-branch"):
        _labelled_sweep(base.replace(branches=None), layers, run_dir, "all branches", meta,
                        callbacks)
        _labelled_sweep(only, layers, run_dir, f"{branch} only", meta, callbacks)
    return _ended(run_dir, "isolate-branch")
