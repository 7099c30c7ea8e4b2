"""A run directory's trials as one flat pandas DataFrame: ``nsadiag.load_trials(run_dir)``.

One row per trial of trials.jsonl (record.json for `nsadiag run`), in file order, with
these columns:

    trial, label, verdict, reason      the trial directory's name, its run's label (as in
                                       summary.json), the verdict and its first reason
    wall_s                             the trial's wall time
    target, n_layers, seq_len, batch, dtype, grad_ckpt, branches, backend, device, steps,
    seed, stall_timeout_s, budget_s, memory_cap_bytes
                                       the spec, once (branches as "cmp,sel" or None)
    overrides.<name>                   each --set override of any trial
    world_size                         ranks (1 outside DDP)
    forward_s, backward_s, step_s, step_s_spread, peak_rss, saved_bytes,
    saved_cmp, saved_sel, saved_win, steps_done
                                       measurements (nsadiag.sweep.row_from_record)

``df.attrs["skipped"]`` lists record lines that were skipped (torn or malformed).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsadiag.rundir import TrialRecord, load_records, read_json
from nsadiag.runmeta import RunMeta

if TYPE_CHECKING:
    import pandas as pd

SPEC_COLUMNS = ("target", "n_layers", "seq_len", "batch", "dtype", "grad_ckpt", "branches",
                "backend", "device", "steps", "seed", "stall_timeout_s", "budget_s",
                "memory_cap_bytes")
MEASURED = ("forward_s", "backward_s", "step_s", "step_s_spread", "peak_rss", "saved_bytes",
            "steps_done")
BRANCHES = ("cmp", "sel", "win")


def triage_labels(state: dict[str, Any]) -> dict[str, str]:
    """Every trial of a triage (triage.json's state) once, labelled by the stage that ran
    it first: sweep, repeat, "<branch> only", "bisect: <knobs applied>"."""
    from nsadiag.triage.state import TriageState

    return TriageState.from_dict(state).labels()


def _labels(run_dir: Path) -> tuple[dict[str, str], str]:
    path = run_dir / "run.json"
    meta = RunMeta.from_dict(read_json(path, "run.json") if path.exists() else {})
    labels = dict(meta.labels)
    if (run_dir / "triage.json").exists():
        labels.update(triage_labels(read_json(run_dir / "triage.json", "triage.json")))
    return labels, meta.command_name or "sweep-layers"


def _row(record: TrialRecord, label: str) -> dict[str, Any]:
    from nsadiag.sweep import row_from_record

    spec = record.spec
    row: dict[str, Any] = {"trial": Path(record.trial_dir).name, "label": label,
                           "verdict": record.verdict_name,
                           "reason": (record.verdict.reasons or [None])[0],
                           "wall_s": record.wall_s}
    for key in SPEC_COLUMNS:
        value = getattr(spec, key)
        row[key] = ",".join(value) if isinstance(value, (list, tuple)) else value
    if spec.command is not None:  # nsadiag run: the user's command instead of a TrialSpec
        row["command"] = " ".join(spec.command)
    for name, value in sorted(spec.overrides.items()):
        row[f"overrides.{name}"] = (",".join(map(str, value))
                                    if isinstance(value, (list, tuple)) else value)
    ddp = record.evidence.ddp if record.evidence is not None else None
    row["world_size"] = ddp.world_size if ddp is not None else 1
    measured = row_from_record(record, label) if spec.target else None
    for key in MEASURED:
        row[key] = getattr(measured, key) if measured else None
    by_branch = (measured.saved_by_branch if measured else None) or {}
    for branch in BRANCHES:
        row[f"saved_{branch}"] = by_branch.get(branch)
    return row


def load_trials(run_dir: Path | str) -> pd.DataFrame:
    """The trials of ``run_dir`` as a flat DataFrame (see the module docstring);
    ValueError (one line) when it holds no trial."""
    import pandas as pd

    run_dir = Path(run_dir)
    skipped: list[str] = []
    records = load_records(run_dir / "trials.jsonl", skipped)
    if not records and (run_dir / "record.json").exists():
        records = [TrialRecord.from_dict(read_json(run_dir / "record.json", "record.json"))]
    if not records:
        raise ValueError(f"run_dir: no trials.jsonl or record.json with a trial in {run_dir}")
    labels, default = _labels(run_dir)
    if (run_dir / "record.json").exists() and default == "sweep-layers":
        default = "run"
    rows = [_row(r, labels.get(Path(r.trial_dir).name) or default) for r in records]
    frame = pd.DataFrame(rows)
    frame.attrs["skipped"] = skipped
    return frame
