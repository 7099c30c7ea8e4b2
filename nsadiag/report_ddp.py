"""The report of an `nsadiag ddp` run: one DDP trial, every rank side by side.

Same shape as nsadiag.report (executive summary, configuration, per-rank results,
evidence, analysis, minimal reproduction, recommendations), built only from the stored
record: the verdict's reasons, the per-rank table (rank, pid, state, collectives issued,
last collective, waiting in, position) and each rank's last heartbeats and stacks.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from nsadiag.report import RECOMMENDATIONS, cli_value, last_events, redact, stack_excerpt
from nsadiag.rundir import TrialRecord


def _cell(value: Any) -> str:
    return "-" if value is None else str(value).replace("|", "/")


def ranks_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| rank | pid | state | collectives issued | last collective | waiting in | "
             "position |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        waiting = row.get("waiting")
        if waiting and row.get("waiting_since_s") is not None:
            waiting = f"{waiting}, {row['waiting_since_s']:.1f} s"
        lines.append(f"| {row['rank']} | {_cell(row.get('pid'))} | {_cell(row.get('state'))} "
                     f"| {_cell(row.get('issued'))} | {_cell(row.get('last_collective'))} | "
                     f"{_cell(waiting)} | {_cell(row.get('position'))} |")
    return lines


def _rank_evidence(rank: dict[str, Any]) -> list[str]:
    lines = [f"### Rank {rank['rank']}", ""]
    exception = (rank.get("result") or {}).get("exception")
    if exception:
        lines += [f"Raised {exception.get('type')}:", "", "```",
                  *str(exception.get("message", "")).strip().splitlines()[:6], "```", ""]
    stall = rank.get("stall") or {}
    if stall.get("cpu_delta_s") is not None and stall.get("window_s"):
        lines += [f"CPU time over the {stall['window_s']:.1f} s watch window: "
                  f"{stall['cpu_delta_s']:.2f} s.", ""]
    lines += ["Last heartbeat events:", ""] + last_events(rank) + [""]
    lines += ["Stacks (last sample):", ""] + stack_excerpt(rank, limit=10)
    return lines + [""]


def _flight_recorder(ddp: dict[str, Any]) -> list[str]:
    dumps = ddp.get("flight_recorder") or []
    if ddp.get("backend") != "nccl":
        return []
    if not dumps:
        return ["NCCL Flight Recorder: armed, no dump was written.", ""]
    lines = ["NCCL Flight Recorder dumps:", ""]
    for dump in dumps:
        summary = dump.get("summary")
        if summary is None:
            lines.append(f"- {dump['file']}: unreadable ({dump.get('unreadable')})")
            continue
        unfinished = ", ".join(f"#{u['seq']} {u['op']} ({u['state']})"
                               for u in summary["unfinished"][:4]) or "none"
        lines.append(f"- {dump['file']}: {summary['entries']} entries, states "
                     f"{summary['states']}; not completed: {unfinished}")
    return lines + [""]


def _reproduction(record: TrialRecord, meta: dict[str, Any]) -> list[str]:
    spec, ddp = record.spec, record.evidence.get("ddp") or {}
    args = ["nsadiag", "ddp", "--world-size", str(ddp.get("world_size")), "--backend",
            str(ddp.get("backend")), "--target", spec["target"], "--seq-len",
            str(spec["seq_len"]), "--batch", str(spec["batch"]), "--dtype", spec["dtype"],
            "--device", spec["device"],
            "--steps", str(spec["steps"]), "--stall-timeout", f"{spec['stall_timeout_s']:g}",
            "--budget", f"{spec['budget_s']:g}"]
    if spec.get("n_layers") is not None:
        args += ["--layers", str(spec["n_layers"])]
    if spec.get("grad_ckpt"):
        args.append("--grad-ckpt")
    for key, value in sorted((spec.get("overrides") or {}).items()):
        args += ["--set", f"{key}={cli_value(value)}"]
    return ["```", shlex.join(args), "```"]


def build_ddp_report(records: list[TrialRecord], meta: dict[str, Any],
                     no_redact: bool = False) -> tuple[str, dict[str, Any]]:
    """(markdown, summary) of a ddp run directory's record."""
    record = records[-1]
    verdict, evidence = record.verdict, record.evidence
    ddp = evidence.get("ddp") or {}
    facts = verdict.get("facts") or {}
    rows = facts.get("ranks") or []
    headline = (f"{verdict['name']} with {ddp.get('world_size')} ranks ({ddp.get('backend')})"
                + (f": rank {', '.join(map(str, facts['odd_ranks']))} diverged"
                   if facts.get("odd_ranks") else ""))
    md = [f"# nsadiag ddp: {headline}", "", "## Executive summary", "",
          f"**{verdict['name']}**. " + verdict["reasons"][0], ""]
    md += ["## Configuration", "", "| field | value |", "|---|---|",
           f"| world size | {ddp.get('world_size')} |", f"| backend | {ddp.get('backend')} |",
           f"| process-group timeout | {ddp.get('pg_timeout_s')} s |"]
    for key in ("target", "n_layers", "seq_len", "batch", "dtype", "grad_ckpt", "device",
                "steps", "stall_timeout_s", "budget_s", "overrides"):
        md.append(f"| {key} | {record.spec.get(key)} |")
    torch_version = ((meta.get("env") or {}).get("packages") or {}).get("torch")
    if torch_version:
        md.append(f"| torch | {torch_version} |")
    md += ["", "## Ranks", ""] + ranks_table(rows)
    md += ["", "## Evidence", "", f"Verdict **{verdict['name']}** after {record.wall_s:.1f} s:",
           ""]
    md += [f"- {reason}" for reason in verdict["reasons"]] + [""]
    md += _flight_recorder(ddp)
    for rank in evidence.get("ranks") or []:
        md += _rank_evidence(rank)
    md += ["## Analysis", ""]
    if facts.get("odd_ranks"):
        md += [f"Implicated: rank(s) {', '.join(map(str, facts['odd_ranks']))} issued "
               f"collective #{facts.get('diverged_at')} differently from the others: "
               "data-dependent control flow around a collective (an extra collective, or a "
               "parameter without a gradient so a DDP bucket never fires).", ""]
    if facts.get("cause"):
        md += [f"Cause: {facts['cause']}.", ""]
    if verdict["name"] == "STALL-COLLECTIVE":
        md += ["Ruled out: a slow run (no rank wrote a heartbeat for the stall timeout) and a "
               "busy rank (each waits in a collective)." if not facts.get("pg_timeout") else
               "Ruled out: a slow run: a rank's collective hit the process-group timeout.", ""]
    md += ["## Minimal reproduction", ""] + _reproduction(record, meta)
    md += ["", "## Recommendations", ""]
    if facts.get("fixes"):
        md += [f"- {fix}" for fix in facts["fixes"]]
    else:
        md += [RECOMMENDATIONS.get(verdict["name"], "Healthy: every rank finished and issued "
                                   "the same collectives.")]
    text = "\n".join(md) + "\n"
    summary = {"command": "ddp", "headline": headline, "verdict": verdict["name"],
               "slow_by": (verdict.get("facts") or {}).get("slow_by"),
               "world_size": ddp.get("world_size"), "backend": ddp.get("backend"),
               "ranks": rows, "odd_ranks": facts.get("odd_ranks"),
               "diverged_at": facts.get("diverged_at"), "failing":
               verdict if verdict["name"] != "OK" else None,
               "flight_recorder": ddp.get("flight_recorder") or []}
    if not no_redact:
        text = redact(text)
        summary = json.loads(redact(json.dumps(summary)))
    return text, summary

