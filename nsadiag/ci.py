"""CI mode: exit codes and the GitHub Actions step summary.

Exit codes of every command that diagnoses (triage, sweep-layers, isolate-branch, ddp,
check; compare uses 0, 2 and 3):
    0  healthy: no trial and no check ended other than OK (a check cut short by its
       time budget is reported as not finished)
    1  a failure was found (any verdict but OK and INCONCLUSIVE; a SLOW by size, the work
       itself outlasting the time limit, is not a failure)
    2  usage error: a bad option, target or file (one line on stderr)
    3  regression: healthy, but step time or peak memory is worse than the baseline's by
       more than the threshold
    4  inconclusive: no failure, but a timing verdict that contention explains or that
       its repeats did not reproduce; rerun on a quieter machine
A failure outranks a regression, a regression an inconclusive result. A triage stopped by
its time limit before finding anything exits 0: nothing failed, and the report says what
was not reached.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nsadiag.verdict import VerdictName, is_failure

EXIT_HEALTHY = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_REGRESSION = 3
EXIT_INCONCLUSIVE = 4


def verdicts_exit_code(names: Iterable[str],
                       slow_by: Iterable[str | None] | None = None) -> int:
    """1 when any verdict is a failure (nsadiag.verdict.is_failure: INCONCLUSIVE is none, nor
    a SLOW whose ``slow_by``, given in the same order as ``names``, is "size"), else 4 when
    any is INCONCLUSIVE, else 0."""
    names = list(names)
    causes = list(slow_by) if slow_by is not None else [None] * len(names)
    if any(is_failure(name, cause) for name, cause in zip(names, causes, strict=True)):
        return EXIT_FAILURE
    return EXIT_INCONCLUSIVE if VerdictName.INCONCLUSIVE in names else EXIT_HEALTHY


def exit_code(summary: Mapping[str, Any]) -> int:
    """The exit code a summary.json stands for: its ``exit_code`` (schema version 1 on);
    for an older summary, a triage's by its status, a sweep's or a DDP run's by its
    verdicts."""
    if isinstance(summary.get("exit_code"), int) and "schema_version" in summary:
        return summary["exit_code"]
    status = summary.get("status")
    if status == "failure":
        return EXIT_FAILURE
    if (summary.get("regression") or {}).get("regressions"):
        return EXIT_REGRESSION
    if status == "inconclusive":
        return EXIT_INCONCLUSIVE
    if status is None:
        rows = [*(summary.get("verdicts") or []),
                *([{"verdict": summary["verdict"], "slow_by": summary.get("slow_by")}]
                  if summary.get("verdict") else [])]
        return verdicts_exit_code([row["verdict"] for row in rows],
                                  [row.get("slow_by") for row in rows])
    return EXIT_HEALTHY


def write_step_summary(markdown: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """Append ``markdown`` to $GITHUB_STEP_SUMMARY when it is set; the path, else None."""
    target = environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    except OSError as err:
        raise ValueError(f"GITHUB_STEP_SUMMARY: cannot append to {path}: "
                         f"{err.strerror or err}") from None
    return path
