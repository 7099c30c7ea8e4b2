"""The report of `nsadiag run -- CMD`: the verdict on the user's own command (and on a
block under ``nsadiag.watch()``, whose record's spec has kind "watch").

report.md: the verdict and its reasons, the command and how it ended, every watched
process (its events by kind), the evidence of the training process (stacks, last events,
the profile's loop and line), the tail of the command's stderr, and what to do next.
summary.json: the common envelope plus the verdict, the command's own exit code and argv.
The record is record.json in the run directory (written by nsadiag.commands.run).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from nsadiag.report.markdown import evidence_section, recommendation
from nsadiag.report.summary import Summary, status_of_rows, verdict_row
from nsadiag.rundir import TrialRecord

STDERR_LINES = 15
LABEL = "run"


def _stderr_tail(run_dir: Path) -> list[str]:
    try:
        lines = (run_dir / "stderr.txt").read_text(errors="replace").splitlines()
    except OSError:
        return []
    return lines[-STDERR_LINES:]


def build_run_report(record: TrialRecord, run_dir: Path) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of one `nsadiag run`."""
    verdict, evidence = record.verdict, record.evidence
    command = shlex.join(record.spec["command"])
    kind = record.spec.get("kind", "run")  # "watch": a block under nsadiag.watch()
    headline = f"{verdict['name']}: {verdict['reasons'][0]}"
    md = [f"# nsadiag {kind}: {verdict['name']}", "", "## Executive summary", "",
          f"`{command}` ended as **{verdict['name']}** after {record.wall_s:.1f} s "
          f"({evidence.get('ended') or 'exit code ' + str(evidence.get('exit_code'))})."
          if kind == "run" else
          f"The block watched in `{command}` (pid {record.spec.get('pid')}) reads as "
          f"**{verdict['name']}** after {record.wall_s:.1f} s.", ""]
    md += [f"- {reason}" for reason in verdict["reasons"]]
    md += ["", "## Processes", "", "Every Python process the command started; at a stall "
           "each was sampled at once (those without a heartbeat too, such as DataLoader "
           "workers), so the odd one out (a rank that waits elsewhere) shows in the last "
           "columns.", "", "| process | pid | what it is | events | stacks at the stop | "
           "where it was |", "|---|---|---|---|---|---|"]
    for process in evidence.get("processes", []):
        counts = ", ".join(f"{kind} {n}" for kind, n in sorted(process["events"].items()))
        main = " (training)" if process["name"] == evidence.get("main_process") else ""
        stacks = (process.get("stall") or {}).get("stacks_class") or "-"
        md.append(f"| {process['name']}{main} | {process['pid']} | "
                  f"{process.get('role') or '-'} | {counts or '-'} | {stacks} | "
                  f"{(process.get('place') or '-').replace('|', '/')} |")
    md += ["", "## Evidence", ""] + evidence_section(record)
    tail = _stderr_tail(run_dir)
    if tail:
        md += ["", "The command's stderr (last lines):", "", "```", *tail, "```"]
    md += ["", "## Recommendations", "",
           recommendation(verdict) or "Nothing to fix: the command finished."]
    if kind == "run":
        md += ["", f"Rerun: `nsadiag run --stall-timeout {record.spec['stall_timeout_s']:g} "
                   f"--deadline {record.spec['deadline_s']:g} -- {command}`"]
    slow_by = (verdict.get("facts") or {}).get("slow_by")
    verdicts = [verdict_row(LABEL, verdict["name"], slow_by=slow_by)]
    summary = Summary(
        command=kind, headline=headline, status=status_of_rows(verdicts), verdicts=verdicts,
        failing=verdict if verdict["name"] != "OK" else None,
        details={"verdict": verdict["name"], "slow_by": slow_by,
                 "command_exit_code": evidence.get("exit_code"),
                 "argv": list(record.spec["command"])})
    return "\n".join(md) + "\n", summary.to_dict()
