"""Which report a run directory gets, rendered from what it stored.

``render_run(run_dir)`` writes report.md and summary.json (and sweep.png for a layer
sweep) from the directory's records: a triage's (triage.json) by nsadiag.triage_report, a
`nsadiag run`'s (record.json) by nsadiag.report_run, a DDP trial's and a sequence-length
sweep's (run.json names the command) by nsadiag.report_ddp and nsadiag.report_seq, any
other sweep's by nsadiag.report. `nsadiag report DIR` and every command end here.
"""

from __future__ import annotations

import json
from pathlib import Path

from nsadiag.report import build_report, redact
from nsadiag.report_ddp import build_ddp_report
from nsadiag.report_run import write_run_report
from nsadiag.report_seq import build_seq_report
from nsadiag.rundir import TrialRecord, load_records
from nsadiag.triage_report import render_triage


def render_run(run_dir: Path, no_redact: bool = False) -> Path:
    """Write the run directory's report.md and summary.json; returns report.md."""
    if (run_dir / "triage.json").exists():
        return render_triage(run_dir, no_redact)
    if (run_dir / "record.json").exists():
        record = TrialRecord.from_dict(json.loads((run_dir / "record.json").read_text()))
        return write_run_report(record, run_dir, no_redact)
    records = load_records(run_dir / "trials.jsonl")
    if not records:
        raise ValueError(f"run_dir: no trials.jsonl with finished trials in {run_dir}")
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if meta.get("command_name") == "ddp":
        text, summary = build_ddp_report(records, meta, no_redact)
    elif meta.get("command_name") == "sweep-seq":
        text, summary = build_seq_report(records, meta)
        if not no_redact:
            text, summary = redact(text), json.loads(redact(json.dumps(summary)))
    else:
        text, summary = build_report(run_dir, records, meta, no_redact)
    (run_dir / "report.md").write_text(text)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return run_dir / "report.md"
