"""The report of `nsadiag attach PID`: what a live process (or every rank of a torchrun
job) read as over the window, from attach.json (written by nsadiag.commands.attach).

report.md: the top block of the finding (nsadiag.finding.attach), one row per process
(state, CPU, the collective it waits in and its own frame), each process's evidence with
its last stack sample, and what to do next. summary.json: the common envelope plus the
finding, the verdict, the state in words, the pid, whether ranks were followed, each
process's state and frames, and the odd ranks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nsadiag.evidence import StackSample
from nsadiag.finding.attach import attach_finding
from nsadiag.ranknames import RankNames
from nsadiag.report.markdown import fold_native
from nsadiag.report.ranks import name_cells
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary, verdict_row
from nsadiag.report.top import cause_section, recommendations

LABEL = "attach"


def _stack_lines(sample: StackSample, depth: int = 12) -> list[str]:
    lines = []
    for thread in sample.threads:
        idle = "" if thread.active else " (idle)"
        lines.append(f"thread {thread.name or hex(thread.thread_id)}{idle}:")
        folded = fold_native([frame.to_dict() for frame in thread.frames])
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


def _cpu(process: dict[str, Any]) -> str:
    cpu = process.get("cpu_fraction")
    return "-" if cpu is None else f"{cpu:.0%}"


def _names_of(process: dict[str, Any]) -> RankNames:
    """A process's names as its environment gave them, its global rank the one it was
    attached as."""
    return dataclasses.replace(RankNames.from_dict(process["names"]), rank=process["rank"])


def _names_cells(process: dict[str, Any]) -> list[str]:
    """Host, global, local and node rank of a process, "unknown" where its environment
    does not say (nsadiag.report.ranks, as the Ranks table of a run)."""
    if not isinstance(process.get("names"), dict):
        return name_cells({"rank": process["rank"]})
    return name_cells({**process["names"], "rank": process["rank"]})


def _names_fields(process: dict[str, Any]) -> dict[str, Any]:
    """summary.json's host, local and node rank of a process (null where unknown), when
    the ranks were named."""
    names = process.get("names")
    if not isinstance(names, dict):
        return {}
    return {"host": names.get("host"), "local_rank": names.get("local_rank"),
            "node_rank": names.get("node_rank")}


def build_attach_report(stored: dict[str, Any], meta: dict[str, Any]
                        ) -> tuple[str, dict[str, Any]]:
    """(report.md text, summary.json) of one attach; ``stored`` is attach.json, ``meta``
    run.json (pid, duration_s, ranks)."""
    verdict, processes = stored["verdict"], stored["processes"]
    state = stored["state"]
    finding = attach_finding(stored, meta)
    report = Report.of(finding)
    named = any(isinstance(p.get("names"), dict) for p in processes)
    heads = "| host | rank | local rank | node rank |" if named else "| rank |"
    table = report.add("Processes", [f"| pid {heads} state | CPU | collective | own frame |",
                                     "|---|---|" + "---|" * (heads.count("|") + 2)]).body
    for p in processes:
        cells = " | ".join(_names_cells(p)) if named else \
            "-" if p["rank"] is None else str(p["rank"])
        table.append(f"| {p['pid']} | {cells} | **{p['state']}** | {_cpu(p)} | "
                     f"{p.get('collective_frame') or '-'} | {p.get('user_frame') or '-'} |")
    md: list[str] = []
    for p in processes:
        label = f"{_names_of(p).label()} (pid {p['pid']})" \
            if isinstance(p.get("names"), dict) and p["rank"] is not None else \
            f"rank {p['rank']} (pid {p['pid']})" if p["rank"] is not None \
            else f"pid {p['pid']}"
        md += [*([""] if md else []), f"### {label}: {p['state']}", "",
               f"`{p.get('cmdline') or ''}`", ""]
        md += [f"- {reason}" for reason in (p.get("verdict") or {}).get("reasons", [])]
        stall = p.get("stall") or {}
        md += [f"- evidence unavailable: {why}" for why in stall.get("unavailable", [])]
        if p.get("heartbeat_events") is not None:
            md.append(f"- nsadiag heartbeat: {p['heartbeat_events']} events in the window")
        samples = stall.get("samples") or []
        if samples:
            md += ["", "Last stack sample, innermost frame first:", "", "```"]
            md += _stack_lines(StackSample.from_dict(samples[-1]))
            md.append("```")
    report.add("Evidence", md)
    report.add("Root cause", cause_section(finding))
    report.add("Recommendations", recommendations(finding))
    summary = Summary(
        command="attach", headline=finding.headline, status=finding.status,
        verdicts=[verdict_row(LABEL, verdict["name"])],
        failing=verdict if verdict["name"] != "OK" else None,
        details={"finding": finding.to_dict(), "verdict": verdict["name"], "state": state,
                 "pid": meta["pid"], "ranks": bool(meta["ranks"]),
                 "processes": [{"pid": p["pid"], "rank": p["rank"],
                                **_names_fields(p), "state": p["state"],
                                "verdict": (p.get("verdict") or {}).get("name"),
                                "user_frame": p.get("user_frame"),
                                "collective_frame": p.get("collective_frame")}
                               for p in processes],
                 "odd_ranks": verdict.get("facts", {}).get("odd_ranks")})
    return report.markdown(), summary.to_dict()
