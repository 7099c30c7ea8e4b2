"""nsadiag check: run correctness checks on a target, keep them, write the report.

The run directory holds run.json, spec.json, one folder per check (the child's events,
result and check.json), checks.json (every CheckResult and their finding, decided once
here: what `nsadiag report` re-renders from), report.md and summary.json
(nsadiag.report.check). Host names, IPs and user names are redacted unless asked not to.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from nsadiag.checks import CHECK_NAMES, CheckResult, run_checks
from nsadiag.finding.check import check_finding
from nsadiag.preflight import check_target
from nsadiag.recordspec import RecordSpec
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.rundir import prepare_run_dir, write_json, write_run_meta, write_text
from nsadiag.spec import TrialSpec


def check_names(names: Sequence[str]) -> list[str]:
    """The checks to run ("all" expanded, in order, once each); ValueError for a name that
    is no check."""
    expanded = [n for name in names for n in (CHECK_NAMES if name == "all" else (name,))]
    for name in expanded:
        if name not in CHECK_NAMES:
            raise ValueError(f"check: must be one of {', '.join(CHECK_NAMES)} or all, "
                             f"got {name!r}")
    return list(dict.fromkeys(expanded))


def check_command(names: Sequence[str], spec: TrialSpec, run_dir: Path, argv: Sequence[str],
                  world_size: int = 2, no_redact: bool = False,
                  on_check: Callable[[str, int, int], None] | None = None,
                  on_plan: Callable[[], None] | None = None
                  ) -> tuple[list[CheckResult], Rendered]:
    """Run the checks (see nsadiag.checks.run_checks) one at a time, telling ``on_plan``
    once the inputs are checked and ``on_check`` (name, index, count) before each check;
    returns them and what the report wrote."""
    todo = check_names(names)
    if "ddp" in todo and world_size < 2:
        raise ValueError(f"world-size: the ddp check needs at least 2 ranks, got {world_size}")
    check_target(spec)
    prepare_run_dir(run_dir)
    if on_plan:
        on_plan()
    write_run_meta(run_dir, "check", list(argv), spec=json.loads(spec.to_json()))
    write_text(run_dir / "spec.json", spec.to_json())
    results: list[CheckResult] = []
    for i, name in enumerate(todo):
        if on_check:
            on_check(name, i, len(todo))
        results += run_checks([name], spec.replace(out_dir=str(run_dir)), run_dir, world_size)
    finding = check_finding(results, RecordSpec.from_dict(json.loads(spec.to_json())),
                            shlex.join(argv) if argv else None)
    write_json(run_dir / "checks.json", {"spec": json.loads(spec.to_json()),
                                         "world_size": world_size,
                                         "results": [r.to_dict() for r in results],
                                         "finding": finding.to_dict()})
    return results, render_run(run_dir, no_redact)
