"""Correctness checks: does the target compute what it claims, not only fast enough?

    causality  perturb tokens >= t; nothing before t may change (first block and branch)
    parity     every available NSA backend against the naive oracle, forward and gradients
    ckpt       gradients with and without checkpointing, and a recompute differential
    ddp        N-rank DDP gradients against one process on the same global batch

`run_check(name, spec, out_dir)` runs one check's model code as a "check" job
(nsadiag.harness.child, watched by nsadiag.harness.jobs; the ddp check on N ranks under
torchrun), so a target that hangs, crashes or runs out of memory cannot hang the caller:
the check then reports the job's verdict (STALL-*, DEADLOCK, OOM, ERROR, CRASH) and counts
as failed. A check that ran reports OK when it passed and WRONG when it found a defect,
naming the first module that differs. Each check writes <out_dir>/<name>/check.json
(rank-0/check.json for ddp) beside the job's files.

A check that runs out of time (its job still progressing at the budget: SLOW, or a timing
verdict a contended machine made INCONCLUSIVE, or a stall inside one long op) is fitted to
its budget and run again: a quarter of the sequence length, then a sixteenth with one
layer, never below FIT_FLOOR tokens (<out_dir>/<name>/fit-S<len>-L<layers>/). What passes
there is reported as what it is, "checked at S=512, 2 layer(s)", with the size that did
not fit. A check no fitted size finishes in time is INCONCLUSIVE: nothing decided, no
module named, never a failure (``CheckResult.failed``), with how far each attempt got.

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
from nsadiag.verdict import TIMING, Verdict, VerdictName
from nsadiag.verdict.triage import CHECK_TIMED_OUT

CHECK_NAMES = ("causality", "parity", "ckpt", "ddp")
UNDECIDED = VerdictName.INCONCLUSIVE
FIT_FLOOR = 128
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
        return self.verdict.facts.check.applicable is not False

    @property
    def failed(self) -> bool:
        """A failure found: the check did not pass and was not cut short by time."""
        return not self.passed and self.verdict.name not in CHECK_TIMED_OUT

    @property
    def status(self) -> str:
        """What to show for the check: "NOT APPLICABLE" for a check that does not apply
        to this target (never OK: nothing was checked), else the verdict's name."""
        return self.verdict.name if self.applicable else NOT_APPLICABLE

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "failed": self.failed,
                "verdict": self.verdict.to_dict(), "status": self.status,
                "module": self.module, "summary": self.summary, "table": self.table}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        return cls(name=data["name"], passed=data["passed"],
                   verdict=Verdict.from_dict(data["verdict"]),
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
    """Run check `name` on `spec`'s target in a watched child, fitted to its budget when
    it runs out of time (see the module docstring); files go to out_dir/name. `world_size`
    is the number of ranks of the ddp check."""
    if name not in CHECK_NAMES:
        raise ValueError(f"check: must be one of {', '.join(CHECK_NAMES)} or all, got {name!r}")
    if name == "ddp" and world_size < 2:
        raise ValueError(f"world_size: the ddp check needs at least 2 ranks, got {world_size}")
    cut: list[tuple[TrialSpec, TrialRecord]] = []
    sizes = fitted_sizes(spec)
    for attempt, size in enumerate(sizes):
        check_dir = Path(out_dir) / name
        if attempt:
            check_dir /= f"fit-S{size.seq_len}-L{size.n_layers or 'default'}"
        record = run_check_job(name, size.replace(out_dir=str(check_dir)),
                               world_size if name == "ddp" else 1)
        found = check_dir / ("rank-0" if name == "ddp" else "") / "check.json"
        if record.verdict_name == "OK" and found.exists():
            result = CheckResult.from_dict(json.loads(found.read_text()))
            return _fitted(result, size, cut) if cut else result
        last = attempt == len(sizes) - 1
        if record.verdict_name not in TIMING or \
                (last and record.verdict_name == "STALL-BUSY"):
            return _did_not_finish(name, record)
        cut.append((size, record))
    return _out_of_time(name, cut)


def fitted_sizes(spec: TrialSpec) -> list[TrialSpec]:
    """The sizes a check tries in turn: as asked; a quarter of the sequence; a sixteenth
    with one layer (never below FIT_FLOOR tokens, each size once)."""
    sizes = [spec]
    floor = min(spec.seq_len, FIT_FLOOR)
    for divisor, layers in ((4, spec.n_layers), (16, 1)):
        size = spec.replace(seq_len=max(floor, spec.seq_len // divisor), n_layers=layers)
        if (size.seq_len, size.n_layers) not in [(s.seq_len, s.n_layers) for s in sizes]:
            sizes.append(size)
    return sizes


def _size(spec: TrialSpec) -> str:
    layers = f"{spec.n_layers} layer(s)" if spec.n_layers else "the factory's layers"
    return f"S={spec.seq_len}, {layers}"


def _reached(record: TrialRecord) -> str:
    """How far a job that was cut short got: its last module event and the wall time."""
    events = record.evidence.events if record.evidence is not None else []
    last = next((e for e in reversed(events) if e.get("module")), None)
    where = (f"reached {last['module']} {last.get('phase') or ''}".rstrip() if last
             else "reached no module")
    return f"{record.verdict_name} after {record.wall_s:.0f} s, {where}"


def _fitted(result: CheckResult, size: TrialSpec,
            cut: list[tuple[TrialSpec, TrialRecord]]) -> CheckResult:
    """A check that finished at a fitted size, saying what it checked and what did not fit."""
    asked, first = cut[0]
    note = (f"checked at {_size(size)}: {_size(asked)} did not finish within the "
            f"{asked.budget_s:g} s budget ({_reached(first)})")
    result.summary = f"{note}; {result.summary}"
    result.verdict.reasons.insert(0, note)
    result.verdict.facts = result.verdict.facts.with_facts(fitted={
        "seq_len": size.seq_len, "n_layers": size.n_layers,
        "asked": {"seq_len": asked.seq_len, "n_layers": asked.n_layers},
        "cut_short": [{"seq_len": s.seq_len, "n_layers": s.n_layers,
                       "verdict": r.verdict_name, "wall_s": r.wall_s} for s, r in cut]})
    return result


def _out_of_time(name: str, cut: list[tuple[TrialSpec, TrialRecord]]) -> CheckResult:
    """INCONCLUSIVE: no size finished within the budget; nothing was compared."""
    tried = "; ".join(f"{_size(s)}: {_reached(r)}" for s, r in cut)
    summary = (f"inconclusive: the {name} check did not finish within its "
               f"{cut[0][0].budget_s:g} s budget at any size, so nothing was compared "
               f"({tried}); give it a larger --budget")
    rows = [{"seq_len": s.seq_len, "n_layers": s.n_layers, "verdict": r.verdict_name,
             "wall_s": round(r.wall_s, 1), "reached": _reached(r)} for s, r in cut]
    verdict = Verdict(UNDECIDED, [summary] + [reason for _, r in cut[:1]
                                              for reason in r.verdict.reasons],
                      {"check": name, "attempts": rows})
    return CheckResult(name, False, verdict, None, summary, rows)


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
    # a copy: a check's result is amended later (fitted to its budget), its record is not
    verdict = Verdict(record.verdict.name, list(record.verdict.reasons),
                      record.verdict.facts.to_dict())
    events = record.evidence.events if record.evidence is not None else []
    modules = [e["module"] for e in events if e.get("module")]
    where = modules[-1] if modules else None
    summary = (f"the {name} check did not finish: {verdict.name}: {verdict.reasons[0]}"
               if verdict.reasons else f"the {name} check did not finish: {verdict.name}")
    return CheckResult(name, False, verdict, where, summary,
                       [{"verdict": verdict.name, "reason": reason} for reason in verdict.reasons])
