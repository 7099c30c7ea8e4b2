"""The report of an `nsadiag ddp` run: one DDP trial, every rank side by side.

The top block and summary of the finding `nsadiag ddp` kept (nsadiag.finding.ddp: the odd
rank's line, the collective that differs), then results, configuration, the per-rank table
(host, global, local and node rank, pid, state, collectives issued, last collective,
waiting in, position: nsadiag.report.ranks), each rank's last heartbeats and stacks, root
cause, minimal reproduction and recommendations, built only from the stored record.
"""

from __future__ import annotations

import shlex
from typing import Any

from nsadiag.evidence import DdpFacts, StallEvidence
from nsadiag.finding.ddp import ddp_rerun
from nsadiag.findingdata import Finding
from nsadiag.report.markdown import config_table, last_events, stack_excerpt
from nsadiag.report.ranks import job_hosts, rank_heading, rank_rows, ranks_table
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary, verdict_row
from nsadiag.report.top import cause_section, recommendations
from nsadiag.rundir import TrialRecord
from nsadiag.runmeta import RunMeta
from nsadiag.sweep import row_from_record

LABEL = "ddp"


def _rank_evidence(rank: dict[str, Any]) -> list[str]:
    lines = [f"### {rank_heading(rank)}", ""]
    exception = (rank.get("result") or {}).get("exception")
    if exception:
        lines += [f"Raised {exception.get('type')}:", "", "```",
                  *str(exception.get("message", "")).strip().splitlines()[:6], "```", ""]
    stall = StallEvidence.from_dict(rank["stall"]) if rank.get("stall") else None
    if stall is not None and stall.cpu_delta_s is not None and stall.window_s:
        lines += [f"CPU time over the {stall.window_s:.1f} s watch window: "
                  f"{stall.cpu_delta_s:.2f} s.", ""]
    lines += ["Last heartbeat events:", ""] + last_events(rank.get("events") or []) + [""]
    lines += ["Stacks (last sample):", ""] + stack_excerpt(stall, limit=10)
    return lines + [""]


def _flight_recorder(ddp: DdpFacts | None) -> list[str]:
    if ddp is None or ddp.backend != "nccl":
        return []
    if not ddp.flight_recorder:
        return ["NCCL Flight Recorder: armed, no dump was written.", ""]
    lines = ["NCCL Flight Recorder dumps:", ""]
    for dump in ddp.flight_recorder:
        summary = dump.get("summary")
        if summary is None:
            lines.append(f"- {dump['file']}: unreadable ({dump.get('unreadable')})")
            continue
        unfinished = ", ".join(f"#{u['seq']} {u['op']} ({u['state']})"
                               for u in summary["unfinished"][:4]) or "none"
        lines.append(f"- {dump['file']}: {summary['entries']} entries, states "
                     f"{summary['states']}; not completed: {unfinished}")
    return lines + [""]


def build_ddp_report(records: list[TrialRecord], meta: RunMeta, finding: Finding
                     ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a ddp run directory's record and its ``finding`` (the
    one `nsadiag ddp` kept, nsadiag.finding.ddp)."""
    record = records[-1]
    verdict, evidence = record.verdict, record.evidence
    ddp = evidence.ddp if evidence is not None else None
    world_size, backend = (ddp.world_size, ddp.backend) if ddp else (None, None)
    facts = verdict.facts
    rows = rank_rows(record)
    report = Report.of(finding)
    torch_version = meta.env.torch if meta.env is not None else None
    report.add("Configuration", config_table(
        record.spec.to_dict(), ("target", "n_layers", "seq_len", "batch", "dtype", "grad_ckpt",
                      "backend", "device", "steps", "stall_timeout_s", "budget_s",
                      "overrides"),
        [("world size", world_size), ("ddp backend", backend),
         ("process-group timeout", _pg_timeout(ddp))]
        + ([("torch", torch_version)] if torch_version else [])))
    report.add("Ranks", ranks_table(rows))
    md = [f"Verdict **{verdict.name}** after {record.wall_s:.1f} s:", ""]
    md += [f"- {reason}" for reason in verdict.reasons] + [""]
    md += _flight_recorder(ddp)
    for rank in (evidence.ranks if evidence is not None else None) or []:
        md += _rank_evidence(rank)
    # every block above ends in its blank line; the last one is the one before the next
    # heading, which the skeleton writes
    report.add("Evidence", md[:-1])
    report.add("Root cause", cause_section(finding))
    report.add("Minimal reproduction", ["```", shlex.join(ddp_rerun(record)), "```"])
    report.add("Recommendations", recommendations(finding))
    text = report.markdown()
    row = row_from_record(record, LABEL)
    slow_by = facts.slow.slow_by
    verdicts = [verdict_row(LABEL, verdict.name, record.spec.n_layers, record.spec.seq_len,
                            slow_by)]
    summary = Summary(
        command="ddp", headline=finding.headline, status=finding.status, verdicts=verdicts,
        rows=[row.to_dict()], failing=verdict.to_dict() if verdict.name != "OK" else None,
        details={"finding": finding.to_dict(), "verdict": verdict.name, "slow_by": slow_by,
                 "world_size": world_size, "ddp_backend": backend,
                 "ranks": [row.to_dict() for row in rows],
                 "hosts": job_hosts(record, rows),
                 "odd_ranks": facts.ranks.odd_ranks, "diverged_at": facts.ranks.diverged_at,
                 "flight_recorder": list(ddp.flight_recorder) if ddp else []})
    return text, summary.to_dict()


def _pg_timeout(ddp: DdpFacts | None) -> str:
    """The process-group timeout, and whether it ends a stalled collective before nsadiag
    samples the ranks (a short one given on purpose)."""
    text = f"{ddp.pg_timeout_s if ddp else None} s"
    if ddp is not None and ddp.pg_timeout_outlasts_capture is False:
        text += (" (shorter than the stall timeout plus the stack sampling: a stalled "
                 "collective raises before the ranks are sampled)")
    return text
