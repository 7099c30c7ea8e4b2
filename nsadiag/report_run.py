"""The report of `nsadiag run -- CMD`: the verdict on the user's own command.

report.md: the verdict and its reasons, the command and how it ended, every watched
process (its events by kind), the evidence of the training process (stacks, last events,
the profile's loop and line), the tail of the command's stderr, and what to do next.
summary.json: command, headline, verdict, the command's exit code.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from nsadiag.report import RECOMMENDATIONS, evidence_section, redact
from nsadiag.rundir import TrialRecord

STDERR_LINES = 15


def _stderr_tail(run_dir: Path) -> list[str]:
    try:
        lines = (run_dir / "stderr.txt").read_text(errors="replace").splitlines()
    except OSError:
        return []
    return lines[-STDERR_LINES:]


def build_run_report(record: TrialRecord, run_dir: Path, no_redact: bool = False
                     ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary) of one `nsadiag run`."""
    verdict, evidence = record.verdict, record.evidence
    command = shlex.join(record.spec["command"])
    headline = f"{verdict['name']}: {verdict['reasons'][0]}"
    md = [f"# nsadiag run: {verdict['name']}", "", "## Executive summary", "",
          f"`{command}` ended as **{verdict['name']}** after {record.wall_s:.1f} s "
          f"(exit code {evidence.get('exit_code')}).", ""]
    md += [f"- {reason}" for reason in verdict["reasons"]]
    md += ["", "## Processes", "", "Every Python process the command started; at a stall "
           "each was sampled at once, so the odd one out (a rank that waits elsewhere) shows "
           "in the stacks column.", "", "| process | pid | events | stacks at the stop |",
           "|---|---|---|---|"]
    for process in evidence.get("processes", []):
        counts = ", ".join(f"{kind} {n}" for kind, n in sorted(process["events"].items()))
        main = " (training)" if process["name"] == evidence.get("main_process") else ""
        stacks = (process.get("stall") or {}).get("stacks_class") or "-"
        md.append(f"| {process['name']}{main} | {process['pid']} | {counts or '-'} | "
                  f"{stacks} |")
    md += ["", "## Evidence", ""] + evidence_section(record)
    tail = _stderr_tail(run_dir)
    if tail:
        md += ["", "The command's stderr (last lines):", "", "```", *tail, "```"]
    md += ["", "## Recommendations", "",
           RECOMMENDATIONS.get(verdict["name"], "") or "Nothing to fix: the command finished."]
    md += ["", f"Rerun: `nsadiag run --stall-timeout {record.spec['stall_timeout_s']:g} "
               f"--deadline {record.spec['deadline_s']:g} -- {command}`"]
    text = "\n".join(md) + "\n"
    summary = {"command": "run", "headline": headline, "verdict": verdict["name"],
               "slow_by": (verdict.get("facts") or {}).get("slow_by"),
               "exit_code": evidence.get("exit_code"), "argv": record.spec["command"]}
    if not no_redact:
        text, summary = redact(text), json.loads(redact(json.dumps(summary)))
    return text, summary


def write_run_report(record: TrialRecord, run_dir: Path, no_redact: bool = False) -> Path:
    """report.md and summary.json of the run, and record.json that `nsadiag report`
    re-renders them from."""
    (run_dir / "record.json").write_text(json.dumps(record.to_dict(), indent=1))
    text, summary = build_run_report(record, run_dir, no_redact)
    (run_dir / "report.md").write_text(text)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return run_dir / "report.md"
