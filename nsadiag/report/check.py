"""The report of `nsadiag check`: correctness checks on a target.

The top block and summary of the finding (nsadiag.finding.check, decided once by the
command and kept in checks.json), then results (one line
per check), configuration, each check's evidence table, root cause, the reproduction and
recommendations. The checks are the run directory's checks.json (``CheckResult.to_dict()``
each, written by nsadiag.commands.check), the configuration its spec, the command its
run.json.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from nsadiag.checks import CheckResult
from nsadiag.finding.check import known_causes
from nsadiag.findingdata import Finding
from nsadiag.recordspec import RecordSpec
from nsadiag.report.markdown import config_table, dict_table
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary, verdict_row
from nsadiag.report.top import cause_section, recommendations


def layers_run(results: Sequence[CheckResult], asked: int | None) -> str:
    """The blocks the checks' models had: what was asked, or the factory's default."""
    seen = sorted({r.verdict.facts.check.layers for r in results} - {None})
    if asked is not None or not seen:
        return str(asked) if asked is not None else "unknown (no block was watched)"
    return f"{', '.join(map(str, seen))} (the factory's default)"


def build_check_report(results: Sequence[CheckResult], spec: RecordSpec,
                       argv: Sequence[str], world_size: int, finding: Finding
                       ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of the checks run on ``spec`` (checks.json's TrialSpec),
    laying out their ``finding`` (checks.json's, decided by nsadiag.commands.check)."""
    report = Report.of(finding)
    shown = {**spec.to_dict(), "n_layers": layers_run(results, spec.n_layers)}
    report.add("Configuration", config_table(
        shown, ("target", "n_layers", "seq_len", "batch", "dtype", "backend", "device", "seed",
                "stall_timeout_s", "budget_s", "overrides"), [("ddp world size", world_size)]))
    evidence: list[str] = []
    for r in results:
        evidence += [*([""] if evidence else []), f"### {r.name}: {r.status}", "",
                     *dict_table(r.table), *(f"- {note}" for note in known_causes(r))]
    report.add("Evidence", evidence)
    report.add("Root cause", cause_section(finding))
    report.add("Minimal reproduction", ["```", shlex.join(argv), "```"])
    report.add("Recommendations", recommendations(finding))
    summary = Summary(
        command="check", headline=finding.headline, status=finding.status,
        verdicts=[verdict_row(r.name, r.status, spec.n_layers, spec.seq_len)
                  for r in results],
        failing=next((r.verdict.to_dict() for r in results if not r.passed and
                      r.verdict.name == finding.verdict), None),
        details={"finding": finding.to_dict(), "passed": finding.status == "healthy",
                 "checks": [r.to_dict() for r in results]})
    return report.markdown(), summary.to_dict()
