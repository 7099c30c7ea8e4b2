"""The report of `nsadiag attach PID`: what a live process (or every rank of a torchrun
job) read as over the window, from attach.json (written by nsadiag.commands.attach).

report.md: the top block of the finding (nsadiag.finding.attach), one row per process
(state, CPU, the collective it waits in and its own frame), each process's evidence with
its last stack sample, and what to do next. summary.json: the common envelope plus the
finding, the verdict, the state in words, the pid, whether ranks were followed, each
process's state and frames, and the odd ranks.
"""

from __future__ import annotations

from typing import Any

from nsadiag.evidence import StackSample
from nsadiag.finding.attach import AttachedProcess, AttachRecord
from nsadiag.findingdata import Finding
from nsadiag.report.markdown import fold_native
from nsadiag.report.ranks import name_cells
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary, verdict_row
from nsadiag.report.top import cause_section, recommendations
from nsadiag.runmeta import RunMeta

LABEL = "attach"


def _stack_lines(sample: StackSample, depth: int = 12) -> list[str]:
    lines = []
    for thread in sample.threads:
        idle = "" if thread.active else " (idle)"
        lines.append(f"thread {thread.name or hex(thread.thread_id)}{idle}:")
        folded = fold_native(thread.frames)
        shown = list(zip(folded, _representatives(thread.frames), strict=True))[:depth]
        for (text, _), frame in shown:
            code = f"  # {frame.code}" if frame is not None and frame.code else ""
            lines.append(f"  {text}{code}")
    return lines


def _representatives(frames: list) -> list:
    """One entry per line of fold_native: the Python frame, or None for a native run."""
    found, native = [], False
    for frame in frames:
        if frame.is_native:
            if not native:
                found.append(None)
            native = True
            continue
        native = False
        found.append(frame)
    return found


def _cpu(process: AttachedProcess) -> str:
    return "-" if process.cpu_fraction is None else f"{process.cpu_fraction:.0%}"


def _names_cells(process: AttachedProcess) -> list[str]:
    """Host, global, local and node rank of a process, "unknown" where its environment
    does not say (nsadiag.report.ranks, as the Ranks table of a run)."""
    if process.names is None:
        return name_cells({"rank": process.rank})
    return name_cells(process.names.to_dict())


def _names_fields(process: AttachedProcess) -> dict[str, Any]:
    """summary.json's host, local and node rank of a process (null where unknown), when
    the ranks were named."""
    if process.names is None:
        return {}
    return {"host": process.names.host, "local_rank": process.names.local_rank,
            "node_rank": process.names.node_rank}


def build_attach_report(stored: AttachRecord, meta: RunMeta, finding: Finding
                        ) -> tuple[str, dict[str, Any]]:
    """(report.md text, summary.json) of one attach; ``stored`` is attach.json, ``meta``
    run.json (pid, duration_s, ranks), ``finding`` the one attach.json keeps (decided by
    nsadiag.commands.attach)."""
    verdict, processes, state = stored.verdict, stored.processes, stored.state
    report = Report.of(finding)
    named = any(p.names is not None for p in processes)
    heads = "| host | rank | local rank | node rank |" if named else "| rank |"
    table = report.add("Processes", [f"| pid {heads} state | CPU | collective | own frame |",
                                     "|---|---|" + "---|" * (heads.count("|") + 2)]).body
    for p in processes:
        cells = " | ".join(_names_cells(p)) if named else \
            "-" if p.rank is None else str(p.rank)
        table.append(f"| {p.pid} | {cells} | **{p.state}** | {_cpu(p)} | "
                     f"{p.collective_frame or '-'} | {p.user_frame or '-'} |")
    md: list[str] = []
    for p in processes:
        md += [*([""] if md else []), f"### {p.label()}: {p.state}", "", f"`{p.cmdline}`", ""]
        md += [f"- {reason}" for reason in (p.verdict.reasons if p.verdict else [])]
        md += [f"- evidence unavailable: {why}"
               for why in (p.stall.unavailable if p.stall else [])]
        if p.heartbeat_events is not None:
            md.append(f"- nsadiag heartbeat: {p.heartbeat_events} events in the window")
        if p.stall is not None and p.stall.samples:
            md += ["", "Last stack sample, innermost frame first:", "", "```"]
            md += _stack_lines(p.stall.samples[-1])
            md.append("```")
    report.add("Evidence", md)
    report.add("Root cause", cause_section(finding))
    report.add("Recommendations", recommendations(finding))
    summary = Summary(
        command="attach", headline=finding.headline, status=finding.status,
        verdicts=[verdict_row(LABEL, verdict.name)],
        failing=verdict.to_dict() if verdict.name != "OK" else None,
        details={"finding": finding.to_dict(), "verdict": verdict.name, "state": state,
                 "pid": meta.pid, "ranks": meta.ranks,
                 "processes": [{"pid": p.pid, "rank": p.rank, **_names_fields(p),
                                "state": p.state,
                                "verdict": p.verdict.name if p.verdict else None,
                                "user_frame": p.user_frame,
                                "collective_frame": p.collective_frame}
                               for p in processes],
                 "odd_ranks": verdict.facts.ranks.odd_ranks})
    return report.markdown(), summary.to_dict()
