"""A triage's state, typed: one field per stage, stored as triage.json.

``TriageState`` is what the engine (nsadiag.triage.engine) fills stage by stage and what
the finding (nsadiag.triage.finding) and the report read. Its JSON form (``to_dict``) keeps
triage.json's keys, so ``from_dict`` reads a triage.json written before the state was typed.

    checks       ChecksStage: each check's result (CheckResult.to_dict() plus "finished")
                 at ``n_layers``, or why the stage was skipped
    sweep        SweepStage: the trials probed for the layer threshold, in order, the
                 threshold, the deepest OK count, the failing trial, whether the search
                 completed, and the counts that were slow by size
    repeats      RepeatsStage: every run of the failing configuration, the verdict most
                 agree on (decide.Confidence.to_dict()), whether they reproduced it
    attribution  Attribution: where the failing trial's time went (decide.attribute_time)
    branches     BranchesStage: each NSA branch alone at the threshold, or why skipped
    bisection    Bisection: the knobs against the baseline, every test, the 1-minimal set
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrialRef:
    """How the state points at a trial: its directory name, verdict, first reason and what
    its work measured (whether its first forward's counts say defect, its median step time,
    the expected cost and their ratio, the efficiency beside the dense block's); a branch
    isolation run names its branch, a bisection test the knobs it applied and whether it
    reproduces the failure."""

    trial: str
    verdict: str
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

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items()
                if v is not None or k not in ("branch", "applied", "reproduces")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRef:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class ChecksStage:
    n_layers: int | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None


@dataclass
class SweepStage:
    probed: list[TrialRef] = field(default_factory=list)
    threshold: int | None = None
    deepest_ok: int | None = None
    failing: TrialRef | None = None
    complete: bool = False
    slow_by_size: list[int] = field(default_factory=list)


@dataclass
class RepeatsStage:
    runs: list[TrialRef] = field(default_factory=list)
    confidence: dict[str, Any] | None = None
    reproduced: bool | None = None


@dataclass
class Attribution:
    trial: str
    by_pattern: list[dict[str, Any]] = field(default_factory=list)
    span_s: float = 0.0
    events: int | None = None
    events_total: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class BranchesStage:
    n_layers: int | None = None
    runs: list[TrialRef] = field(default_factory=list)
    skipped: str | None = None


@dataclass
class Bisection:
    verdict: str
    n_layers: int | None
    changes: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    tests: list[TrialRef] = field(default_factory=list)
    minimal: dict[str, Any] | None = None
    minimal_trial: str | None = None


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
    base_spec: dict[str, Any]
    world_size: int = 1
    stages_done: list[str] = field(default_factory=list)
    stopped: str | None = None
    elapsed_s: float | None = None
    env: dict[str, Any] | None = None
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
            "stopped": self.stopped, "base_spec": self.base_spec,
            "world_size": self.world_size, "env_problems": self.env_problems}
        if self.env is not None:
            data["env"] = self.env
        if self.elapsed_s is not None:
            data["elapsed_s"] = self.elapsed_s
        if self.checks is not None:
            data["checks"] = ({"skipped": self.checks.skipped} if self.checks.skipped else
                              {"n_layers": self.checks.n_layers,
                               "results": self.checks.results})
        if self.sweep is not None:
            sweep = self.sweep
            data["sweep"] = {"probed": [r.to_dict() for r in sweep.probed],
                             "threshold": sweep.threshold, "deepest_ok": sweep.deepest_ok,
                             "failing": sweep.failing.to_dict() if sweep.failing else None,
                             "complete": sweep.complete, "slow_by_size": sweep.slow_by_size}
        if self.repeats is not None:
            data["repeats"] = {"runs": [r.to_dict() for r in self.repeats.runs],
                               **({"confidence": self.repeats.confidence}
                                  if self.repeats.confidence else {}),
                               **({"reproduced": self.repeats.reproduced}
                                  if self.repeats.reproduced is not None else {})}
        if self.attribution is not None:
            a = self.attribution
            data["attribution"] = {"trial": a.trial, "by_pattern": a.by_pattern,
                                   "span_s": a.span_s, "events": a.events,
                                   "events_total": a.events_total, **a.extra}
        if self.branches is not None:
            data["branches"] = ({"skipped": self.branches.skipped} if self.branches.skipped
                                else {"n_layers": self.branches.n_layers,
                                      "runs": [r.to_dict() for r in self.branches.runs]})
        if self.bisection is not None:
            b = self.bisection
            data["bisection"] = {"verdict": b.verdict, "n_layers": b.n_layers,
                                 "changes": b.changes, "baseline": b.baseline,
                                 "tests": [t.to_dict() for t in b.tests],
                                 "minimal": b.minimal, "minimal_trial": b.minimal_trial}
        if self.regression is not None:
            data["regression"] = dataclasses.asdict(self.regression)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TriageState:
        """The state of a triage.json (KeyError or TypeError for a malformed one)."""
        def refs(items: list[dict[str, Any]] | None) -> list[TrialRef]:
            return [TrialRef.from_dict(item) for item in items or []]

        state = cls(target=data["target"], argv=list(data.get("argv") or []),
                    max_layers=data["max_layers"], max_minutes=data["max_minutes"],
                    trial_budget_s=data["trial_budget_s"],
                    user_budget_s=data["user_budget_s"],
                    base_spec=dict(data.get("base_spec") or {}),
                    world_size=data.get("world_size", 1),
                    stages_done=list(data.get("stages_done") or []),
                    stopped=data.get("stopped"), elapsed_s=data.get("elapsed_s"),
                    env=data.get("env"), env_problems=list(data.get("env_problems") or []))
        if "checks" in data:
            checks = data["checks"]
            state.checks = ChecksStage(checks.get("n_layers"), list(checks.get("results")
                                                                    or []),
                                       checks.get("skipped"))
        if "sweep" in data:
            sweep = data["sweep"]
            state.sweep = SweepStage(refs(sweep.get("probed")), sweep.get("threshold"),
                                     sweep.get("deepest_ok"),
                                     TrialRef.from_dict(sweep["failing"])
                                     if sweep.get("failing") else None,
                                     bool(sweep.get("complete")),
                                     list(sweep.get("slow_by_size") or []))
        if "repeats" in data:
            repeats = data["repeats"]
            state.repeats = RepeatsStage(refs(repeats.get("runs")), repeats.get("confidence"),
                                         repeats.get("reproduced"))
        if "attribution" in data:
            a = dict(data["attribution"])
            known = {"trial", "by_pattern", "span_s", "events", "events_total"}
            state.attribution = Attribution(a["trial"], list(a.get("by_pattern") or []),
                                            float(a.get("span_s") or 0.0), a.get("events"),
                                            a.get("events_total"),
                                            {k: v for k, v in a.items() if k not in known})
        if "branches" in data:
            branches = data["branches"]
            state.branches = BranchesStage(branches.get("n_layers"), refs(branches.get("runs")),
                                           branches.get("skipped"))
        if data.get("bisection"):
            b = data["bisection"]
            state.bisection = Bisection(b["verdict"], b.get("n_layers"), dict(b["changes"]),
                                        dict(b["baseline"]), refs(b.get("tests")),
                                        b.get("minimal"), b.get("minimal_trial"))
        if data.get("regression"):
            r = data["regression"]
            state.regression = Regression(r["path"], r["threshold"], list(r.get("rows") or []))
        return state
