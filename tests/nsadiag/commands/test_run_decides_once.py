"""One `nsadiag run` decides its Finding once, where the command has its record, writes
record.json once and never reads it back; `nsadiag report` later renders the same report
from the stored record without deciding again."""

from __future__ import annotations

import json
import sys
from collections import Counter

import nsadiag.commands.run as run_command
import nsadiag.finding.run as run_findings
import nsadiag.report.dispatch as dispatch
from nsadiag.commands.run import run_user_command
from nsadiag.report.dispatch import render_run

SCRIPT = "import sys; print('the step ran'); sys.exit(3)"


def test_one_run_decides_its_finding_once_and_reads_no_record_back(tmp_path, monkeypatch):
    counts: Counter[str] = Counter()
    decide, write, read = run_findings.run_finding, run_command.write_json, dispatch.read_json

    def counted_decide(record):
        counts["decided"] += 1
        return decide(record)

    def counted_write(path, data, *args, **kwargs):
        counts[f"wrote {path.name}"] += 1
        return write(path, data, *args, **kwargs)

    def counted_read(path, what):
        counts[f"read {path.name}"] += 1
        return read(path, what)

    monkeypatch.setattr(run_findings, "run_finding", counted_decide)
    monkeypatch.setattr(run_command, "write_json", counted_write)
    monkeypatch.setattr(dispatch, "read_json", counted_read)
    run = tmp_path / "run"
    rendered = run_user_command([sys.executable, "-c", SCRIPT], run, ["nsadiag", "run"],
                                stall_timeout_s=60.0, deadline_s=120.0)
    # the render lays out the record it was handed: it reads no stored file back
    assert counts == {"decided": 1, "wrote record.json": 1}
    stored = json.loads((run / "record.json").read_text())
    assert stored["finding"] == rendered.summary["finding"]
    assert rendered.summary["verdict"] == "ERROR" and rendered.summary["command_exit_code"] == 3

    # a later `nsadiag report` reads the record once and renders its finding as it is
    report, summary = rendered.report.read_text(), rendered.summary
    counts.clear()
    again = render_run(run)
    assert counts == {"read run.json": 1, "read record.json": 1}
    assert again.report.read_text() == report and again.summary == summary
