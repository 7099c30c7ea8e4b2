"""CI mode: exit codes and the GitHub Actions step summary.

Exit codes of `nsadiag triage` (and `nsadiag compare` for 0, 2 and 3):
    0  healthy: no trial and no check ended other than OK (a check cut short by its
       time budget is reported as not finished)
    1  a failure was found (any non-OK verdict)
    2  usage error: a bad option, target or file (one line on stderr)
    3  regression: healthy, but step time or peak memory is worse than the baseline's by
       more than the threshold
A failure outranks a regression. A triage stopped by its time limit before finding anything
exits 0: nothing failed, and the report says what was not reached.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EXIT_HEALTHY = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_REGRESSION = 3


def exit_code(summary: Mapping[str, Any]) -> int:
    """The exit code a triage summary.json stands for."""
    if summary.get("status") == "failure":
        return EXIT_FAILURE
    if (summary.get("regression") or {}).get("regressions"):
        return EXIT_REGRESSION
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
