"""nsadiag triage on the per-token-loop zoo entry: SLOW, with the module the time goes to and
the hot frame; --ci appends the report to $GITHUB_STEP_SUMMARY and exits 1 (failure)."""

import json
import os

import psutil

from nsadiag.finding import Finding
from nsadiag.report.dispatch import render_run
from tests.helpers import nsadiag
from tests.readable import assert_readable


def test_per_token_loop_triage_is_slow_with_module_and_hot_frame(tmp_path):
    out, step_summary = tmp_path / "run", tmp_path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(step_summary)}
    # 1000 steps cannot finish within 10 s on any machine: SLOW by construction, and a
    # single block's backward at 256 tokens is far shorter than the 15 s stall timeout
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    done = nsadiag("triage", "--target", "repro.per_token_loop:make", "--seq-len", "256",
                   "--steps", "1000", "--budget", "10", "--stall-timeout", "15",
                   "--max-layers", "1", "--max-minutes", "5", "--no-checks", "--no-bisect",
                   "--ci", "--out", str(out), env=env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    summary = json.loads((out / "summary.json").read_text())
    failure = summary["failure"]
    assert summary["status"] == "failure" and summary["threshold"] == 1
    assert failure["verdict"] == "SLOW"
    assert failure["confidence"]["total"] == 2 and failure["confidence"]["verdict"] == "SLOW"
    # the part of the model the time goes to, from the heartbeats: the block, forward or
    # backward, with nearly all of the training time
    assert failure["module"] in ("blocks.* forward", "blocks.* backward")
    assert failure["hot_frame"], "no hot frame from the sampled profile"
    # the line is the per-token loop, never the hottest healthy line of the model
    finding = Finding.from_dict(summary["finding"])
    assert (finding.verdict, finding.kind) == ("SLOW", "slow by defect")
    assert failure["culprit"] == finding.culprit.where() == "repro/per_token_loop.py:26-30"
    assert "host reads" in finding.proof and "per_token_loop.py:26-30" in finding.next_action
    report = (out / "report.md").read_text()
    assert_readable(report, finding, "repro/per_token_loop.py:26-30")
    for section in ("## Summary", "## Results", "## Environment", "## Configuration comparison",
                    "## Systematic results", "### Where the time goes", "## Evidence",
                    "## Root cause", "Ruled out:", "Implicated:",
                    "## Minimal reproduction", "## Recommendations", "## Time"):
        assert section in report, section
    assert "A hang: it was still progressing" in report
    # the time by module is a share of the span it was measured over: never above 100 %
    table = report.split("### Where the time goes")[1].split("\n\n")[1].splitlines()[2:]
    assert table and all(int(row.split("|")[4].strip().rstrip("%")) <= 100 for row in table)
    assert failure["module"].split()[0] in report
    assert "![flame graph of the sampled profile](flame.png)" in report
    assert (out / "flame.png").stat().st_size > 0 and "profile.folded" in report
    assert "Branch isolation" in report and "no NSA branches" in report
    assert "nsadiag sweep-layers --target repro.per_token_loop:make --layers 1" in report
    assert step_summary.read_text() == "earlier step\n" + report
    # re-rendering the run directory (what `nsadiag report` does) gives the triage report
    (out / "report.md").unlink()
    assert render_run(out).report.read_text() == report
