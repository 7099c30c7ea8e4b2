"""A triage's state, typed: one field per stage, stored as triage.json.

``TriageState`` is what the engine (nsadiag.triage.engine) fills stage by stage and what
the finding (nsadiag.triage.finding) and the report read. Its JSON form (``to_dict``) keeps
triage.json's keys, so ``from_dict`` reads a triage.json written before the state was typed.

    checks       ChecksStage: each check's result (a CheckResult; stored as its to_dict() plus
                 "finished") at ``n_layers``, or why the stage was skipped
    sweep        SweepStage: the trials probed for the layer threshold, in order, the
                 threshold, the deepest OK count, the failing trial, whether the search
                 completed, and the counts that were slow by size
    repeats      RepeatsStage: every run of the failing configuration, the verdict most
                 agree on (a decide.Confidence), whether they reproduced it
    attribution  Attribution: where the failing trial's time went (decide.attribute_time:
                 ModuleTime entries, layers summed and per module)
    branches     BranchesStage: each NSA branch alone at the threshold, or why skipped
    bisection    Bisection: the knobs against the baseline, every test, the 1-minimal set
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nsadiag.checks import CheckResult
from nsadiag.envinfo import EnvReport
from nsadiag.spec import TrialSpec
from nsadiag.stored import optional
from nsadiag.triage.decide import Confidence, ModuleTime
from nsadiag.verdict import VerdictName


@dataclass
class TrialRef:
    """How the state points at a trial: its directory name, verdict, first reason and what
    its work measured (whether its first forward's counts say defect, its median step time,
    the expected cost and their ratio, the efficiency beside the dense block's); a branch
    isolation run names its branch, a bisection test the knobs it applied and whether it
    reproduces the failure."""

    trial: str
    verdict: VerdictName
    n_layers: int | None = None
    world_size: int = 1
    reason: str = ""
    slow_by: str | None = None
    defect: bool | None = None
    step_s: float | None = None
    timed_steps: int = 0
    expected_step_s: float | None = None
    cost_ratio: float | None = None
    efficiency: float | None = None
    dense_efficiency: float | None = None
    branch: str | None = None
    applied: list[str] | None = None
    reproduces: bool | None = None

    def __post_init__(self) -> None:
        self.verdict = VerdictName(self.verdict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items()
                if v is not None or k not in ("branch", "applied", "reproduces")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRef:
        return _stored(cls, data)


Stored = TypeVar("Stored")


def _stored(cls: type[Stored], data: dict[str, Any], **parsed: Any) -> Stored:
    """``cls`` from the stored keys it declares (a key not stored keeps the field's default,
    one it does not declare is left out), ``parsed`` replacing stored values that are
    parsed into typed objects."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{**{k: v for k, v in data.items() if k in names}, **parsed})


def _refs(data: dict[str, Any], key: str) -> list[TrialRef]:
    return [TrialRef.from_dict(item) for item in data.get(key) or []]


@dataclass
class ChecksStage:
    n_layers: int | None = None
    results: list[CheckResult] = field(default_factory=list)
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": self.skipped}
        return {"n_layers": self.n_layers,
                "results": [{**r.to_dict(), "finished": finished(r)} for r in self.results]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChecksStage:
        return _stored(cls, data,
                       results=[CheckResult.from_dict(r)
                                for r in optional(data, "results", list) or []])


def finished(result: CheckResult) -> bool:
    """Whether a check ran to an answer (OK or WRONG), rather than being cut short or
    ending in the runner's verdict; triage.json stores it beside each result."""
    return result.verdict.name in (VerdictName.OK, VerdictName.WRONG)


@dataclass
class SweepStage:
    probed: list[TrialRef] = field(default_factory=list)
    threshold: int | None = None
    deepest_ok: int | None = None
    failing: TrialRef | None = None
    complete: bool = False
    slow_by_size: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"probed": [r.to_dict() for r in self.probed], "threshold": self.threshold,
                "deepest_ok": self.deepest_ok,
                "failing": self.failing.to_dict() if self.failing else None,
                "complete": self.complete, "slow_by_size": self.slow_by_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepStage:
        failing = optional(data, "failing", dict)
        return _stored(cls, data, probed=_refs(data, "probed"),
                       failing=TrialRef.from_dict(failing) if failing else None)


@dataclass
class RepeatsStage:
    runs: list[TrialRef] = field(default_factory=list)
    confidence: Confidence | None = None
    reproduced: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"runs": [r.to_dict() for r in self.runs]}
        if self.confidence:
            data["confidence"] = self.confidence.to_dict()
        if self.reproduced is not None:
            data["reproduced"] = self.reproduced
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepeatsStage:
        conf = optional(data, "confidence", dict)
        return _stored(cls, data, runs=_refs(data, "runs"),
                       confidence=Confidence.from_dict(conf) if conf else None)


@dataclass
class Attribution:
    """Where the failing trial's time went (decide.attribute_time): ``by_pattern`` with the
    layers summed, ``by_module`` per module, both longest first; ``extra`` keeps keys of a
    triage.json this version does not know."""

    trial: str
    by_pattern: list[ModuleTime] = field(default_factory=list)
    span_s: float = 0.0
    events: int | None = None
    events_total: int | None = None
    by_module: list[ModuleTime] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.trial, "by_pattern": [t.to_dict() for t in self.by_pattern],
                "span_s": self.span_s, "events": self.events,
                "events_total": self.events_total,
                **({"by_module": [t.to_dict() for t in self.by_module]}
                   if self.by_module is not None else {}), **self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attribution:
        names = {f.name for f in dataclasses.fields(cls)}
        by_module = optional(data, "by_module", list)
        return _stored(cls, data,
                       by_pattern=[ModuleTime(**t)
                                   for t in optional(data, "by_pattern", list) or []],
                       by_module=[ModuleTime(**t) for t in by_module]
                       if by_module is not None else None,
                       extra={k: v for k, v in data.items() if k not in names})


@dataclass
class BranchesStage:
    n_layers: int | None = None
    runs: list[TrialRef] = field(default_factory=list)
    skipped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.skipped:
            return {"skipped": self.skipped}
        return {"n_layers": self.n_layers, "runs": [r.to_dict() for r in self.runs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BranchesStage:
        return _stored(cls, data, runs=_refs(data, "runs"))


@dataclass
class Bisection:
    verdict: VerdictName
    n_layers: int | None
    changes: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    tests: list[TrialRef] = field(default_factory=list)
    minimal: dict[str, Any] | None = None
    minimal_trial: str | None = None

    def __post_init__(self) -> None:
        self.verdict = VerdictName(self.verdict)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "n_layers": self.n_layers, "changes": self.changes,
                "baseline": self.baseline, "tests": [t.to_dict() for t in self.tests],
                "minimal": self.minimal, "minimal_trial": self.minimal_trial}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Bisection:
        return _stored(cls, data, changes=dict(data["changes"]),
                       baseline=dict(data["baseline"]), tests=_refs(data, "tests"))


@dataclass
class Regression:
    path: str
    threshold: float
    rows: list[dict[str, Any]] = field(default_factory=list)


STAGES = ("env", "checks", "sweep", "repeats", "attribution", "branches", "bisection")


@dataclass
class TriageState:
    """Everything one triage learnt (see the module docstring)."""

    target: str
    argv: list[str]
    max_layers: int
    max_minutes: float
    trial_budget_s: float
    user_budget_s: float
    base_spec: TrialSpec
    world_size: int = 1
    stages_done: list[str] = field(default_factory=list)
    stopped: str | None = None
    elapsed_s: float | None = None
    env: EnvReport | None = None
    env_problems: list[str] = field(default_factory=list)
    checks: ChecksStage | None = None
    sweep: SweepStage | None = None
    repeats: RepeatsStage | None = None
    attribution: Attribution | None = None
    branches: BranchesStage | None = None
    bisection: Bisection | None = None
    regression: Regression | None = None

    @property
    def failing(self) -> TrialRef | None:
        """The sweep's failing trial, None when there is none or the repeats did not
        reproduce its verdict."""
        if self.repeats is not None and self.repeats.reproduced is False:
            return None
        return self.sweep.failing if self.sweep else None

    def labels(self) -> dict[str, str]:
        """Every trial once, labelled by the stage that ran it first: sweep, repeat,
        "<branch> only", "bisect: <knobs applied>"."""
        labelled: dict[str, str] = {}
        for ref in self.sweep.probed if self.sweep else []:
            labelled.setdefault(ref.trial, "sweep")
        for ref in (self.repeats.runs[1:] if self.repeats else []):
            labelled.setdefault(ref.trial, "repeat")
        for ref in self.branches.runs if self.branches else []:
            labelled.setdefault(ref.trial, f"{ref.branch} only")
        for ref in self.bisection.tests if self.bisection else []:
            labelled.setdefault(ref.trial, f"bisect: {', '.join(ref.applied or []) or 'none'}")
        return labelled

    def to_dict(self) -> dict[str, Any]:
        """triage.json's form (the keys of every stage as before the state was typed)."""
        data: dict[str, Any] = {
            "target": self.target, "argv": self.argv, "max_layers": self.max_layers,
            "max_minutes": self.max_minutes, "trial_budget_s": self.trial_budget_s,
            "user_budget_s": self.user_budget_s, "stages_done": self.stages_done,
            "stopped": self.stopped, "base_spec": self.base_spec.to_dict(),
            "world_size": self.world_size, "env_problems": self.env_problems}
        if self.env is not None:
            data["env"] = self.env.as_dict()
        if self.elapsed_s is not None:
            data["elapsed_s"] = self.elapsed_s
        stages = {"checks": self.checks, "sweep": self.sweep, "repeats": self.repeats,
                  "attribution": self.attribution, "branches": self.branches,
                  "bisection": self.bisection}
        data.update({name: stage.to_dict() for name, stage in stages.items()
                     if stage is not None})
        if self.regression is not None:
            data["regression"] = dataclasses.asdict(self.regression)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TriageState:
        """The state of a triage.json (KeyError, TypeError or ValueError for a malformed
        one): every stage, check result, confidence and the base spec parsed here, once."""
        # a stage is parsed when stored; the bisection and the regression only when not
        # empty (an empty one was written before the state was typed)
        stages = {name: kind.from_dict(data[name]) if name in data else None
                  for name, kind in STAGE_TYPES.items()}
        bisection = optional(data, "bisection", dict)
        stages["bisection"] = Bisection.from_dict(bisection) if bisection else None
        regression = optional(data, "regression", dict)
        env = optional(data, "env", dict)
        return _stored(cls, data, base_spec=TrialSpec(**data["base_spec"]), **stages,
                       regression=_stored(Regression, regression) if regression else None,
                       env=EnvReport.from_dict(env) if env else None)


STAGE_TYPES = {"checks": ChecksStage, "sweep": SweepStage, "repeats": RepeatsStage,
               "attribution": Attribution, "branches": BranchesStage}
"""The stages of triage.json parsed into their typed form whenever stored."""
