"""Correctness checks: does the target compute what it claims, not only fast enough?

    causality  perturb tokens >= t; nothing before t may change (first block and branch)
    parity     every available NSA backend against the naive oracle, forward and gradients
    ckpt       gradients with and without checkpointing, and a recompute differential
    ddp        N-rank DDP gradients against one process on the same global batch

`run_check(name, spec, out_dir)` runs one check's model code as a "check" job
(nsadiag.harness.child, watched by nsadiag.harness.jobs; the ddp check on N ranks under
torchrun), so a target that hangs, crashes or runs out of memory cannot hang the caller:
the check then reports the job's verdict (SLOW, STALL-*, DEADLOCK, OOM, ERROR, CRASH) and
counts as failed. A check that ran reports OK when it passed and WRONG when it found a
defect, naming the first module that differs. Each check writes
<out_dir>/<name>/check.json (rank-0/check.json for ddp) beside the job's files.

This module imports no torch: the child arms faulthandler before the slow import.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsadiag.harness.jobs import run_check_job
from nsadiag.rundir import TrialRecord
from nsadiag.spec import TrialSpec
from nsadiag.verdict import Verdict

CHECK_NAMES = ("causality", "parity", "ckpt", "ddp")
NOT_APPLICABLE = "NOT APPLICABLE"
DDP_WORLD_SIZE = 2
TOLERANCE = 1e-5
"""fp32 tolerance on max abs error, relative to max(1, max |reference|)."""


@dataclass
class CheckResult:
    """What one check found.

    name     "causality" | "parity" | "ckpt" | "ddp"
    passed   the check ran and found nothing wrong
    verdict  OK when passed, WRONG when it found a defect, else the runner's verdict
    module   the first module that differs or breaks (e.g. "blocks.0", "layers.1.attn.sel")
    summary  one sentence with the measured numbers
    table    rows for the report; every row of one check has the same keys
    """

    name: str
    passed: bool
    verdict: Verdict
    module: str | None
    summary: str
    table: list[dict[str, Any]] = field(default_factory=list)

    @property
    def applicable(self) -> bool:
        return self.verdict.facts.get("applicable", True) is not False

    @property
    def status(self) -> str:
        """What to show for the check: "NOT APPLICABLE" for a check that does not apply
        to this target (never OK: nothing was checked), else the verdict's name."""
        return self.verdict.name if self.applicable else NOT_APPLICABLE

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "verdict": self.verdict.to_dict(),
                "status": self.status, "module": self.module, "summary": self.summary,
                "table": self.table}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        return cls(name=data["name"], passed=data["passed"], verdict=Verdict(**data["verdict"]),
                   module=data["module"], summary=data["summary"], table=data["table"])


def finding(name: str, passed: bool, module: str | None, summary: str,
            table: list[dict[str, Any]], **facts: Any) -> CheckResult:
    """The result of a check that ran: OK when passed, else WRONG naming `module`."""
    verdict = Verdict("OK" if passed else "WRONG", [summary],
                      {"check": name, "module": module, **facts})
    return CheckResult(name, passed, verdict, None if passed else module, summary, table)


def not_applicable(name: str, why: str) -> CheckResult:
    """A check that does not apply to this target: no failure (``passed``), shown as
    NOT APPLICABLE with why and what would make it apply."""
    return finding(name, True, None, f"not applicable: {why}", [], applicable=False)


def run_check(name: str, spec: TrialSpec, out_dir: Path,
              world_size: int = DDP_WORLD_SIZE) -> CheckResult:
    """Run check `name` on `spec`'s target in a watched child; files go to out_dir/name.
    `world_size` is the number of ranks of the ddp check."""
    if name not in CHECK_NAMES:
        raise ValueError(f"check: must be one of {', '.join(CHECK_NAMES)} or all, got {name!r}")
    if name == "ddp" and world_size < 2:
        raise ValueError(f"world_size: the ddp check needs at least 2 ranks, got {world_size}")
    check_dir = Path(out_dir) / name
    record = run_check_job(name, spec.replace(out_dir=str(check_dir)),
                           world_size if name == "ddp" else 1)
    found = check_dir / ("rank-0" if name == "ddp" else "") / "check.json"
    if record.verdict_name == "OK" and found.exists():
        return CheckResult.from_dict(json.loads(found.read_text()))
    return _did_not_finish(name, record)


def run_checks(names: Sequence[str], spec: TrialSpec, out_dir: Path,
               world_size: int = DDP_WORLD_SIZE) -> list[CheckResult]:
    """Each check in turn (see run_check); "all" stands for every check."""
    expanded = [n for name in names for n in (CHECK_NAMES if name == "all" else (name,))]
    for name in expanded:  # refuse a bad name before any child starts
        if name not in CHECK_NAMES:
            raise ValueError(f"check: must be one of {', '.join(CHECK_NAMES)} or all, "
                             f"got {name!r}")
    if "ddp" in expanded and world_size < 2:
        raise ValueError(f"world_size: the ddp check needs at least 2 ranks, got {world_size}")
    return [run_check(name, spec, out_dir, world_size) for name in dict.fromkeys(expanded)]


def _did_not_finish(name: str, record: TrialRecord) -> CheckResult:
    verdict = Verdict(**record.verdict)
    modules = [e["module"] for e in record.evidence.get("events") or [] if e.get("module")]
    where = modules[-1] if modules else None
    summary = (f"the {name} check did not finish: {verdict.name}: {verdict.reasons[0]}"
               if verdict.reasons else f"the {name} check did not finish: {verdict.name}")
    return CheckResult(name, False, verdict, where, summary,
                       [{"verdict": verdict.name, "reason": reason} for reason in verdict.reasons])
