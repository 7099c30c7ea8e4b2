"""The triage engine: stages that run trials and record what they learnt in triage.json.

Stages, in order (each stores what it learnt in <run_dir>/triage.json before the next):

1. env      collect_env() and the problems that weaken the evidence (no py-spy, ...)
   checks   nsadiag.checks causality, parity, ckpt (and ddp with world_size > 1) at
            min(2, max_layers) layers; a check ending WRONG, ERROR, CRASH, OOM or in a
            stall is a failure; one cut short by its time budget is fitted to it (a shorter
            sequence, one layer) and says what it checked, or is INCONCLUSIVE: not
            finished, it decides nothing; checks are not resumed: a rerun runs them again
2. sweep    the layer threshold: trials at 1, 2, 4, ... layers, then binary search
            between the deepest OK count and the first failing one (nsadiag.triage.decide);
            a SLOW that is slow by size (the work outlasts the budget, no defect in how it
            is done: nsadiag.verdict.size_or_defect) is no failure and is never bisected
3. on a non-OK verdict at the threshold:
   repeats      the failing configuration again, until the verdicts agree or 3 ran; a
                timing verdict (SLOW, STALL-BUSY, INCONCLUSIVE) that most repeats do not
                confirm as a failure did not reproduce: the triage reports it as
                inconclusive and stops there (a crash or a deadlock seen once stands)
   attribution  where the failing trial's time went, from its heartbeat events
   branches     for NSA targets: each branch alone at the threshold depth
   bisection    delta debugging of the knobs that differ from the healthy baseline
                (grad_ckpt, dtype, backend, branches, seq_len, world_size) to a 1-minimal
                failing set; world_size > 1 runs the trial under torchrun (nsadiag ddp);
                a test reproduces a SLOW when its work shows the defect (counts, or time
                per step far above its expected cost: nsadiag.triage.decide.reproduces),
                not when it merely ran out of budget
4. report   the finding (nsadiag.triage.finding), report.md and summary.json
            (nsadiag.report.triage), optionally compared with a baseline summary.json for
            regressions in step time and peak memory.

The state is typed (nsadiag.triage.state.TriageState, one field per stage) and stored as
triage.json after every stage.

Time: the whole triage stays inside ``max_minutes``. Each trial gets the planned budget
(``plan_trial_budget``) or what is left; when not even a minimal trial fits, the triage
stops and the report says what is known and what was not reached. A trial cut short by the
limit that ends SLOW only says the time ran out, and a trial whose budget ran out before
training started says nothing; either stops the triage as well.

Resuming: trials are appended to trials.jsonl; a rerun with the same options in the same
run directory takes finished trials from there (the n-th run of a configuration reuses the
n-th stored record) and continues where the last run stopped.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsadiag.checks import run_check
from nsadiag.envinfo import collect_env
from nsadiag.finding.trial import work_counts
from nsadiag.harness.jobs import run_ddp_trial, run_trial
from nsadiag.harness.targetcheck import inspect_target
from nsadiag.rundir import (
    TrialRecord,
    append_record,
    load_records,
    next_trial_index,
    write_json,
)
from nsadiag.spec import BRANCHES, TrialSpec
from nsadiag.sweep import Callbacks, row_from_record
from nsadiag.triage.decide import (
    BASELINE,
    OutOfTime,
    TimeLimit,
    TriageStop,
    attribute_time,
    baseline_values,
    bracket,
    confidence,
    ddmin,
    env_problems,
    find_threshold,
    knob_changes,
    needs_repeat,
    plan_trial_budget,
    reproduced,
    reproduces,
)
from nsadiag.triage.state import (
    Attribution,
    Bisection,
    BranchesStage,
    ChecksStage,
    RepeatsStage,
    SweepStage,
    TriageState,
    TrialRef,
)
from nsadiag.verdict import is_failure
from nsadiag.verdict.size_or_defect import slow_by

MAX_RUNS = 3  # runs of the failing configuration when its verdicts disagree
DDP_EXTRA_OVERHEAD_S = 20.0
"""A DDP trial's evidence takes longer: py-spy samples of every rank (up to
nsadiag.commands.ddp.SAMPLE_TIMEOUT_S each) and the ranks' teardown."""


@dataclass
class TriageOptions:
    """What the triage may do: the deepest layer count, the wall-clock limit, whether to
    isolate branches and bisect knobs on a failure, and the report's redaction."""

    max_layers: int = 8
    max_minutes: float = 10.0
    checks: bool = True
    isolate: bool = True
    bisect: bool = True
    world_size: int = 1
    ddp_backend: str = "gloo"
    no_redact: bool = False

    def validate(self) -> TriageOptions:
        if not isinstance(self.max_layers, int) or self.max_layers < 1:
            raise ValueError(f"max-layers: must be a positive integer, got {self.max_layers!r}")
        if not self.max_minutes > 0:
            raise ValueError(f"max-minutes: must be > 0, got {self.max_minutes:g}")
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world-size: must be an integer >= 1, got {self.world_size!r}")
        return self


@dataclass
class TriageCallbacks(Callbacks):
    """Callbacks of a sweep plus ``on_stage(text)``, called as each stage starts."""

    on_stage: Callable[[str], None] | None = None


@dataclass
class _Book:
    """Trials of this run directory: run new ones, reuse finished ones on a rerun."""

    run_dir: Path
    limit: TimeLimit
    clock: Callable[[], float]
    callbacks: TriageCallbacks
    stored: dict[str, list[TrialRecord]] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def __post_init__(self) -> None:
        for record in load_records(self.run_dir / "trials.jsonl"):
            ddp = record.evidence.ddp if record.evidence is not None else None
            world_size = ddp.world_size if ddp is not None else 1
            self.stored.setdefault(_config_key({**record.spec.to_dict(),
                                                "world_size": world_size}),
                                   []).append(record)

    def run(self, spec: TrialSpec, world_size: int = 1, ddp_backend: str = "gloo"
            ) -> TrialRecord:
        """The next record of ``spec`` on ``world_size`` processes (budget and directory
        filled in here); OutOfTime when the limit leaves no room, or when a trial shortened
        by it ended SLOW; TriageStop when its budget ran out before training started."""
        key = _config_key({**spec.to_dict(), "world_size": world_size})
        index = self.used[key]
        stored = [r for r in self.stored.get(key, []) if not _cut_short(r, self.limit)]
        if index < len(stored):
            self.used[key] += 1
            record = stored[index]
        else:
            extra = DDP_EXTRA_OVERHEAD_S if world_size > 1 else 0.0
            budget = self.limit.trial_budget(self.clock(), extra)
            trial_dir = self.run_dir / f"trial-{next_trial_index(self.run_dir)}"
            spec = spec.replace(budget_s=budget, out_dir=str(trial_dir),
                                stall_timeout_s=min(spec.stall_timeout_s, budget))
            if self.callbacks.on_trial:
                self.callbacks.on_trial(spec.n_layers or 0, spec)
            if world_size > 1:
                record = run_ddp_trial(spec, world_size, ddp_backend,
                                       on_events=self.callbacks.on_events)
            else:
                record = run_trial(spec, on_events=self.callbacks.on_events)
            append_record(self.run_dir / "trials.jsonl", record)
            self.used[key] += 1
        if self.callbacks.on_record:
            self.callbacks.on_record(record)
        if not _started_training(record):
            raise TriageStop(f"the {record.spec.budget_s:.0f} s budget of "
                             f"{Path(record.trial_dir).name} ran out before training started "
                             f"(starting Python, importing torch and building the model took "
                             f"longer), so its verdict decides nothing: raise --budget")
        if _cut_short(record, self.limit) and record.verdict_name == "SLOW":
            raise OutOfTime(f"the trial in {Path(record.trial_dir).name} was shortened to "
                            f"{record.spec.budget_s:.0f} s by the time limit and did not "
                            f"finish")
        return record


def _config_key(spec: dict[str, Any]) -> str:
    """What makes two trials the same configuration (not their directory or budget)."""
    ignored = ("out_dir", "budget_s", "stall_timeout_s")
    return json.dumps({k: v for k, v in spec.items() if k not in ignored}, sort_keys=True)


def _started_training(record: TrialRecord) -> bool:
    """False for a trial the budget killed while it was still starting up."""
    evidence = record.evidence
    if evidence is None or evidence.outcome.kill_reason != "budget":
        return True
    return any(e.get("phase") != "build" for e in evidence.events)


def _cut_short(record: TrialRecord, limit: TimeLimit) -> bool:
    return (record.spec.budget_s or 0.0) < limit.planned_budget_s - 1e-6


def slow_by_size(record: TrialRecord) -> bool:
    """SLOW because the work outlasts the budget, not because of a defect
    (nsadiag.verdict.size_or_defect): big, not broken."""
    return record.verdict_name == "SLOW" and record.slow_by == "size"


def chased(record: TrialRecord) -> bool:
    """A trial the triage chases: not OK, and not merely slow by size; an INCONCLUSIVE one
    is chased too (is_failure with inconclusive_fails), its repeats decide."""
    return is_failure(record.verdict_name, record.slow_by, inconclusive_fails=True)


def _trial_ref(record: TrialRecord, **extra: Any) -> TrialRef:
    """How the state points at a trial: directory name, verdict, first reason, and what
    its work measured: whether the counts of its first forward say defect, its median
    step time, expected cost and their ratio (nsadiag.probes.efficiency), whatever its
    verdict."""
    ddp = record.evidence.ddp if record.evidence is not None else None
    world_size = ddp.world_size if ddp is not None else 1
    row = row_from_record(record)
    return TrialRef(trial=Path(record.trial_dir).name, verdict=record.verdict_name,
                    n_layers=record.spec.n_layers, world_size=world_size,
                    reason=record.verdict.reasons[0],
                    slow_by=record.slow_by,
                    defect=_defect_counted(record), step_s=row.step_s,
                    timed_steps=row.timed_steps, expected_step_s=row.expected_step_s,
                    cost_ratio=row.cost_ratio, efficiency=row.efficiency,
                    dense_efficiency=row.dense_efficiency, **extra)


def _defect_counted(record: TrialRecord) -> bool | None:
    """Whether the counts of the trial's first forward say defect (host reads per token,
    tiny ops), None when no forward was counted."""
    found, _ = slow_by(work_counts(record), record.spec.seq_len or 0)
    return None if found is None else found == "defect"


def accepted_knobs(spec: TrialSpec) -> list[str]:
    """The bisection knobs this target can vary: all for "nsa"; for a factory, dtype,
    seq_len and world_size (the trial honours them) plus those its signature declares."""
    if spec.target == "nsa":
        return list(BASELINE)
    params = inspect_target(spec).accepts or ()  # imported in a child, never here
    return ["dtype", "seq_len", "world_size",
            *[k for k in ("grad_ckpt", "backend", "branches") if k in params]]


def spec_knobs(spec: TrialSpec, world_size: int = 1) -> dict[str, Any]:
    """The value of every bisection knob: the spec's fields and the world size."""
    values = {k: getattr(spec, k) for k in BASELINE if k != "world_size"}
    if values["branches"] is not None:
        values["branches"] = list(values["branches"])
    return {**values, "world_size": world_size}


class Triage:
    """One triage in one run directory; ``run()`` returns the state stored in triage.json."""

    def __init__(self, base: TrialSpec, options: TriageOptions, run_dir: Path,
                 argv: Sequence[str], callbacks: TriageCallbacks | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.base, self.options, self.run_dir = base, options, run_dir
        self.callbacks = callbacks or TriageCallbacks()
        self.clock = clock
        self.started = clock()
        planned = plan_trial_budget(options.max_minutes, base.budget_s)
        self.limit = TimeLimit(self.started + options.max_minutes * 60.0, planned)
        self.book = _Book(run_dir, self.limit, clock, self.callbacks)
        self.state = TriageState(
            target=base.target, argv=list(argv), max_layers=options.max_layers,
            max_minutes=options.max_minutes, trial_budget_s=planned,
            user_budget_s=base.budget_s, base_spec=base,
            world_size=options.world_size)

    # ---- driving -------------------------------------------------------------------------

    def run(self) -> TriageState:
        stages = [("env", self.env), ("checks", self.checks), ("sweep", self.sweep),
                  ("repeats", self.repeats), ("attribution", self.attribution),
                  ("branches", self.branches), ("bisection", self.bisection)]
        try:
            for name, stage in stages:
                if self.callbacks.on_stage:
                    self.callbacks.on_stage(name)
                stage()
                self.state.stages_done.append(name)
                self._save()
        except TriageStop as stop:
            self.state.stopped = f"stopped in the {name} stage: {stop}"
        self.state.elapsed_s = self.clock() - self.started
        self._save()
        return self.state

    def _save(self) -> None:
        # never through a planted link
        write_json(self.run_dir / "triage.json", self.state.to_dict())

    @property
    def failing(self) -> TrialRef | None:
        """The sweep's failing trial, None when there is none or the repeats did not
        reproduce its verdict."""
        return self.state.failing

    def _depth_spec(self, n_layers: int, **changes: Any) -> TrialSpec:
        return self.base.replace(n_layers=n_layers, **changes)

    def _run(self, spec: TrialSpec, world_size: int | None = None) -> TrialRecord:
        """A trial on the triage's world size (or ``world_size``)."""
        size = self.options.world_size if world_size is None else world_size
        return self.book.run(spec, size, self.options.ddp_backend)

    # ---- stages --------------------------------------------------------------------------

    def env(self) -> None:
        env = collect_env()
        self.state.env = env
        self.state.env_problems = env_problems(env, self.base.device)

    def checks(self) -> None:
        if not self.options.checks:
            self.state.checks = ChecksStage(skipped="--no-checks")
            return
        names = ["causality", "parity", "ckpt"] + (["ddp"] if self.options.world_size > 1
                                                   else [])
        stage = ChecksStage(n_layers=min(2, self.options.max_layers))
        self.state.checks = stage
        for name in names:
            budget = self.limit.trial_budget(self.clock())
            spec = self._depth_spec(stage.n_layers, budget_s=budget,
                                    stall_timeout_s=min(self.base.stall_timeout_s, budget))
            stage.results.append(run_check(name, spec, self.run_dir / "checks",
                                           world_size=max(2, self.options.world_size)))
            self._save()

    def sweep(self) -> None:
        records: dict[int, TrialRecord] = {}
        sweep = SweepStage()
        self.state.sweep = sweep

        def fails(n: int) -> bool:
            records[n] = self._run(self._depth_spec(n))
            sweep.probed.append(_trial_ref(records[n]))
            sweep.deepest_ok, sweep.threshold = bracket(
                {k: chased(r) for k, r in records.items()})
            sweep.slow_by_size = sorted(k for k, r in records.items() if slow_by_size(r))
            if sweep.threshold is not None:  # known so far, should the time run out
                sweep.failing = _trial_ref(records[sweep.threshold])
            return chased(records[n])

        found = find_threshold(fails, self.options.max_layers)
        sweep.threshold, sweep.deepest_ok, sweep.complete = (found.threshold, found.deepest_ok,
                                                             True)
        if found.threshold is not None:
            sweep.failing = _trial_ref(records[found.threshold])

    def repeats(self) -> None:
        if not self.failing:
            return
        spec = self._depth_spec(self.failing.n_layers)
        stage = RepeatsStage(runs=[self.failing])
        self.state.repeats = stage
        while needs_repeat([r.verdict for r in stage.runs], MAX_RUNS):
            stage.runs.append(_trial_ref(self._run(spec)))
            # kept after every run: a stop by the time limit keeps what the runs so far say
            stage.confidence = confidence([r.verdict for r in stage.runs])
        found = confidence([r.verdict for r in stage.runs])
        stage.confidence, stage.reproduced = found, reproduced(stage.runs[0].verdict, found)

    def attribution(self) -> None:
        if not self.failing:
            return
        record = self._record(self.failing.trial)
        found = attribute_time(record.evidence)
        self.state.attribution = Attribution(
            self.failing.trial, found.by_pattern, found.span_s, found.events,
            found.events_total, found.by_module)

    def branches(self) -> None:
        if not (self.failing and self.options.isolate):
            return
        if self.base.target != "nsa" and "branches" not in accepted_knobs(self.base):
            self.state.branches = BranchesStage(
                skipped=f"{self.base.target} has no NSA branches to isolate")
            return
        names = list(self.base.branches or BRANCHES)
        if len(names) < 2:
            self.state.branches = BranchesStage(
                skipped=f"only the {names[0]} branch is computed")
            return
        stage = BranchesStage(n_layers=self.failing.n_layers)
        self.state.branches = stage
        for branch in names:
            record = self._run(self._depth_spec(self.failing.n_layers, branches=(branch,)))
            stage.runs.append(_trial_ref(record, branch=branch))

    def bisection(self) -> None:
        if not (self.failing and self.options.bisect):
            return
        knobs = spec_knobs(self.base, self.options.world_size)
        changes = knob_changes(knobs, accepted_knobs(self.base))
        baseline = baseline_values(knobs, changes)
        verdict, depth = self.failing.verdict, self.failing.n_layers
        bisection = Bisection(verdict, depth, changes, baseline)
        self.state.bisection = bisection
        by_subset: dict[frozenset[str], TrialRef] = {
            frozenset(changes): _trial_ref(self._record(self.failing.trial))}

        def fails(subset: frozenset[str]) -> bool:
            knobs = {**baseline, **{k: changes[k] for k in subset}}
            world_size = knobs.pop("world_size", self.options.world_size)
            spec = self._depth_spec(depth, **_as_spec_fields(knobs))
            ref = _trial_ref(self._run(spec, world_size),
                             applied=sorted(subset, key=list(changes).index))
            ref.reproduces = reproduces(verdict, ref)
            bisection.tests.append(ref)
            by_subset[subset] = ref
            return ref.reproduces

        minimal = ddmin(list(changes), fails)
        bisection.minimal = {k: changes[k] for k in minimal}
        bisection.minimal_trial = by_subset[frozenset(minimal)].trial

    def _record(self, trial: str) -> TrialRecord:
        for record in load_records(self.run_dir / "trials.jsonl"):
            if Path(record.trial_dir).name == trial:
                return record
        raise KeyError(trial)


def _as_spec_fields(knobs: dict[str, Any]) -> dict[str, Any]:
    """Knob values (without world_size) as TrialSpec fields: branches as a tuple."""
    fields = dict(knobs)
    if fields.get("branches") is not None:
        fields["branches"] = tuple(fields["branches"])
    return fields
