"""The report of `nsadiag attach PID`: what a live process (or every rank of a torchrun
job) read as over the window, from attach.json (written by nsadiag.commands.attach).

report.md: the verdict and its reasons, one row per process (state, CPU, the collective it
waits in and its own frame), each process's evidence with its last stack sample, and what
to do next. summary.json: the common envelope plus the verdict, the state in words, the
pid, whether ranks were followed, each process's state and frames, and the odd ranks.
"""

from __future__ import annotations

from typing import Any

from nsadiag.evidence import StackSample
from nsadiag.report.markdown import RECOMMENDATIONS
from nsadiag.report.summary import Summary, status_of_verdicts, verdict_row

LABEL = "attach"
NOTHING_STUCK = ("Nothing stuck was seen in the window: if the run still seems to hang, attach "
                 "for longer, or run it under `nsadiag run` for a heartbeat and a deadline.")


def _stack_lines(sample: StackSample, depth: int = 12) -> list[str]:
    lines = []
    for thread in sample.threads:
        idle = "" if thread.active else " (idle)"
        lines.append(f"thread {thread.name or hex(thread.thread_id)}{idle}:")
        for frame in thread.frames[:depth]:
            code = f"  # {frame.code}" if frame.code else ""
            lines.append(f"  {frame.where()}{' [native]' if frame.is_native else ''}{code}")
    return lines


def _cpu(process: dict[str, Any]) -> str:
    cpu = process.get("cpu_fraction")
    return "-" if cpu is None else f"{cpu:.0%}"


def build_attach_report(stored: dict[str, Any], meta: dict[str, Any]
                        ) -> tuple[str, dict[str, Any]]:
    """(report.md text, summary.json) of one attach; ``stored`` is attach.json, ``meta``
    run.json (pid, duration_s, ranks)."""
    verdict, processes = stored["verdict"], stored["processes"]
    state = stored["state"]
    headline = f"{verdict['name']}: {verdict['reasons'][0]}"
    target = f"the ranks under pid {meta['pid']}" if meta["ranks"] else f"pid {meta['pid']}"
    md = [f"# nsadiag attach: {verdict['name']}", "", "## Executive summary", "",
          f"Watched {target} for {meta['duration_s']:g} s without stopping it: "
          f"**{state}**.", ""]
    md += [f"- {reason}" for reason in verdict["reasons"]]
    md += ["", "## Processes", "", "| pid | rank | state | CPU | collective | own frame |",
           "|---|---|---|---|---|---|"]
    for p in processes:
        rank = "-" if p["rank"] is None else p["rank"]
        md.append(f"| {p['pid']} | {rank} | **{p['state']}** | {_cpu(p)} | "
                  f"{p.get('collective_frame') or '-'} | {p.get('user_frame') or '-'} |")
    md += ["", "## Evidence"]
    for p in processes:
        label = f"rank {p['rank']} (pid {p['pid']})" if p["rank"] is not None \
            else f"pid {p['pid']}"
        md += ["", f"### {label}: {p['state']}", "", f"`{p.get('cmdline') or ''}`", ""]
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
    md += ["", "## Recommendations", "",
           RECOMMENDATIONS.get(verdict["name"], "") or NOTHING_STUCK]
    summary = Summary(
        command="attach", headline=headline, status=status_of_verdicts([verdict["name"]]),
        verdicts=[verdict_row(LABEL, verdict["name"])],
        failing=verdict if verdict["name"] != "OK" else None,
        details={"verdict": verdict["name"], "state": state, "pid": meta["pid"],
                 "ranks": bool(meta["ranks"]),
                 "processes": [{"pid": p["pid"], "rank": p["rank"], "state": p["state"],
                                "verdict": (p.get("verdict") or {}).get("name"),
                                "user_frame": p.get("user_frame"),
                                "collective_frame": p.get("collective_frame")}
                               for p in processes],
                 "odd_ranks": verdict.get("facts", {}).get("odd_ranks")})
    return "\n".join(md) + "\n", summary.to_dict()
