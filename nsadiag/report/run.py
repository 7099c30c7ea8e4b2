"""The report of `nsadiag run -- CMD`: the verdict on the user's own command (and on a
block under ``nsadiag.watch()``, whose record's spec has kind "watch").

report.md: the top block and summary of the record's finding (decided once, when the record
was made: nsadiag.finding.run), the results,
every watched process (its events by kind), each process's private and shared memory
(nsadiag.report.process_memory), the ranks of a job of several (by host, global,
local and node rank: nsadiag.report.ranks), the evidence of the training process (stacks,
last events, the profile's loop and line, a flame graph), the tail of the command's
stderr, and what to do next. summary.json: the common envelope plus the finding, the
verdict, the command's own exit code and argv, the per-rank rows (``ranks``) and the
job's hosts (``hosts``). The record is record.json in the run directory (written by
nsadiag.commands.run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsadiag.evidence import StallEvidence
from nsadiag.findingdata import Finding
from nsadiag.report.markdown import evidence_section
from nsadiag.report.plots import flame_section
from nsadiag.report.process_memory import process_memory_section
from nsadiag.report.ranks import job_hosts, rank_rows, ranks_table
from nsadiag.report.skeleton import Report
from nsadiag.report.straggler import straggler_section
from nsadiag.report.summary import Summary, verdict_row
from nsadiag.report.top import cause_section, recommendations
from nsadiag.rundir import TrialRecord, read_tail
from nsadiag.stored import optional

STDERR_LINES = 15
STDERR_TAIL_BYTES = 64 * 1024  # read from the end only: a command's stderr may be huge
LABEL = "run"


@dataclass(frozen=True)
class ProcessRow:
    """One process of the record's command facts (nsadiag.harness.record.command_facts)
    as the Processes table shows it: its name, pid, role, heartbeat events by kind, what
    its stacks read as at the stop and where it was (None: not sampled)."""

    name: str
    pid: int | None
    role: str | None
    events: dict[str, int]
    stacks_class: str | None
    place: str | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessRow:
        stall = optional(data, "stall", dict)
        return cls(name=str(data["name"]), pid=optional(data, "pid", int),
                   role=optional(data, "role", str),
                   events=dict(optional(data, "events", dict) or {}),
                   stacks_class=StallEvidence.from_dict(stall).stacks_class if stall else None,
                   place=optional(data, "place", str))


def _stderr_tail(run_dir: Path) -> list[str]:
    lines = read_tail(run_dir / "stderr.txt", STDERR_TAIL_BYTES).splitlines()
    return lines[-STDERR_LINES:]


def containment_lines(containment: Any) -> list[str]:
    """How the command's processes were kept from outliving it (nsadiag.harness.launch):
    a cgroup killed whole, or best effort and why."""
    if not isinstance(containment, dict):
        return []
    if containment.get("cgroup"):
        return ["", "Containment: the command and every process it started ran in a cgroup "
                "of their own, killed whole at the end."]
    why = str(containment.get("why_not") or "no cgroup could be made")
    return ["", f"Containment was best effort ({why}): the processes were found by the "
            f"token in their environment, the process tree and the adoption of orphans; "
            f"one that dropped its environment and left the tree between two looks (0.2 s) "
            f"could outlive the run."]


def _main_pid(command: Any) -> int | None:
    """The training process's pid, from the command facts' process rows."""
    for row in command.processes if command is not None else []:
        if row.get("name") == command.main_process and isinstance(row.get("pid"), int):
            return row["pid"]
    return None


def build_run_report(record: TrialRecord, finding: Finding, run_dir: Path
                     ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of one `nsadiag run`, laying out ``finding`` (the record's
    own, decided when it was made: nsadiag.finding.run) beside the record's evidence;
    writes flame.png when the training process was profiled."""
    verdict, evidence = record.verdict, record.evidence
    command = evidence.command if evidence is not None else None
    report = Report.of(finding)
    md = report.add("Processes", [
        "Every Python process the command started; at a stall each was sampled at once "
        "(those without a heartbeat too, such as DataLoader workers), so the odd one out (a "
        "rank that waits elsewhere) shows in the last columns.", "",
        "| process | pid | what it is | events | stacks at the stop | where it was |",
        "|---|---|---|---|---|---|"]).body
    for process in map(ProcessRow.from_dict, command.processes if command else []):
        counts = ", ".join(f"{kind} {n}" for kind, n in sorted(process.events.items()))
        main = " (training)" if command and process.name == command.main_process else ""
        md.append(f"| {process.name}{main} | {process.pid} | {process.role or '-'} | "
                  f"{counts or '-'} | {process.stacks_class or '-'} | "
                  f"{(process.place or '-').replace('|', '/')} |")
    md += containment_lines(evidence.containment if evidence is not None else None)
    memory = process_memory_section(
        evidence.process_memory if evidence is not None else None,
        _main_pid(command), run_dir)
    if memory:
        report.add("Process memory", memory)
    rows = rank_rows(record)
    if rows:
        report.add("Ranks", ranks_table(rows))
    hosts = evidence.hosts if evidence is not None else None
    straggler = straggler_section((hosts or {}).get("straggler"))
    if straggler:
        report.add("Straggler", straggler)
    md = report.add("Evidence", evidence_section(record)).body
    md += flame_section(record, finding, run_dir)
    tail = _stderr_tail(run_dir)
    if tail:
        md += ["", "The command's stderr (last lines):", "", "```", *tail, "```"]
    report.add("Root cause", cause_section(finding))
    report.add("Recommendations", recommendations(finding))
    slow_by = record.slow_by
    summary = Summary(
        command=finding.command, headline=finding.headline, status=finding.status,
        verdicts=[verdict_row(LABEL, verdict.name, slow_by=slow_by)],
        failing=verdict.to_dict() if verdict.name != "OK" else None,
        details={"finding": finding.to_dict(), "verdict": verdict.name,
                 "slow_by": slow_by,
                 "command_exit_code": command.exit_code if command else None,
                 "argv": list(record.spec.command or ()), "ranks": [row.to_dict() for row in rows],
                 "hosts": job_hosts(record, rows),
                 "straggler": (hosts or {}).get("straggler")})
    return report.markdown(), summary.to_dict()
