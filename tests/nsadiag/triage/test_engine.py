"""The triage engine (nsadiag.triage.engine) driven over trials already in trials.jsonl, as
a rerun in the same run directory finds them (no trial runs: starting one fails the
test): the depth search brackets and bisects to the smallest failing depth, the repeats
confirm a deadlock or find that a timing verdict did not reproduce, the knob bisection
keeps the one change that fails, and the stages stop on a trial whose budget ran out
before training started. Also the options it refuses and the knobs it varies."""

import json
from pathlib import Path
from typing import Any

import pytest

import nsadiag.triage.engine as engine
from nsadiag.envinfo import EnvReport
from nsadiag.rundir import append_record
from nsadiag.spec import TrialSpec
from nsadiag.triage.decide import BASELINE, TriageStop, plan_trial_budget
from nsadiag.triage.engine import Triage, TriageOptions, accepted_knobs, spec_knobs
from nsadiag.triage.state import TriageState
from tests.helpers import trial_record

BASE = TrialSpec(target="nsa", seq_len=64, steps=2, grad_ckpt=True, dtype="bfloat16",
                 stall_timeout_s=5.0, budget_s=30.0)
MINUTES = 10.0
PLANNED_S = plan_trial_budget(MINUTES, BASE.budget_s)


@pytest.fixture(autouse=True)
def no_trial_runs(monkeypatch):
    """Every trial must come from trials.jsonl; the environment is a fixed report."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a trial was started: {args[0]}")
    monkeypatch.setattr(engine, "run_trial", refuse)
    monkeypatch.setattr(engine, "run_ddp_trial", refuse)
    env = {"py_spy": "not found on PATH", "cpu_count": 2, "torch_threads": 2}
    monkeypatch.setattr(engine, "collect_env", lambda: EnvReport.from_dict(env))


class Stored:
    """trials.jsonl of a run directory, written a record at a time in trial order."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.count = run_dir, 0

    def add(self, verdict: str, n_layers: int, *, events: list[dict] | None = None,
            kill_reason: str | None = None, **knobs: Any) -> str:
        trial = f"trial-{self.count}"
        self.count += 1
        spec = BASE.replace(n_layers=n_layers, out_dir=str(self.run_dir / trial),
                            budget_s=PLANNED_S, **knobs).to_dict()
        record = trial_record(spec, {"status": "ok"} if verdict == "OK" else None, verdict,
                              str(self.run_dir / trial), events=events,
                              reasons=[f"{verdict} at {n_layers} layer(s)"])
        if kill_reason is not None:
            record.evidence.outcome.exit_code = None
            record.evidence.outcome.killed_by_runner = True
            record.evidence.outcome.kill_reason = kill_reason
        append_record(self.run_dir / "trials.jsonl", record)
        return trial


def triage(run_dir: Path, **options: Any) -> Triage:
    chosen = {"max_layers": 4, "max_minutes": MINUTES, "checks": False, "isolate": False,
              **options}
    return Triage(BASE, TriageOptions(**chosen), run_dir, ["nsadiag", "triage"],
                  clock=lambda: 0.0)


def test_the_depth_search_bisects_to_the_smallest_failing_depth_and_repeats_confirm_it(
        tmp_path):
    stored = Stored(tmp_path)
    depth = {n: stored.add(verdict, n) for n, verdict in
             ((1, "OK"), (2, "OK"), (4, "DEADLOCK"), (3, "DEADLOCK"))}
    repeat = stored.add("DEADLOCK", 3)
    # the bisection: the baseline at 3 layers passes, checkpointing alone deadlocks
    baseline = stored.add("OK", 3, grad_ckpt=False, dtype="float32")
    ckpt_only = stored.add("DEADLOCK", 3, dtype="float32")
    state = triage(tmp_path).run()
    assert state.stopped is None
    assert state.stages_done == ["env", "checks", "sweep", "repeats", "attribution",
                                 "branches", "bisection"]
    assert state.env_problems[0].startswith("py-spy not found on PATH: verdicts come without")
    assert state.checks.skipped == "--no-checks"
    sweep = state.sweep
    assert [ref.trial for ref in sweep.probed] == [depth[1], depth[2], depth[4], depth[3]]
    assert (sweep.threshold, sweep.deepest_ok, sweep.complete) == (3, 2, True)
    assert sweep.failing.trial == depth[3] and sweep.failing.reason == "DEADLOCK at 3 layer(s)"
    assert [ref.trial for ref in state.repeats.runs] == [depth[3], repeat]
    assert state.repeats.reproduced and state.repeats.confidence.text() == "2 of 2"
    bisection = state.bisection
    assert bisection.changes == {"grad_ckpt": True, "dtype": "bfloat16"}
    assert [ref.trial for ref in bisection.tests] == [baseline, ckpt_only]
    assert [ref.reproduces for ref in bisection.tests] == [False, True]
    assert bisection.minimal == {"grad_ckpt": True} and bisection.minimal_trial == ckpt_only
    # what was learnt is stored, and reads back as the same state
    stored_state = TriageState.from_dict(json.loads((tmp_path / "triage.json").read_text()))
    assert stored_state.to_dict() == state.to_dict()


def test_a_timing_verdict_the_repeats_do_not_confirm_is_no_failure_found(tmp_path):
    stored = Stored(tmp_path)
    first = stored.add("INCONCLUSIVE", 1)
    stored.add("OK", 1)
    stored.add("OK", 1)
    state = triage(tmp_path, bisect=False).run()
    assert state.sweep.threshold == 1 and state.sweep.deepest_ok is None
    assert [ref.verdict for ref in state.repeats.runs] == ["INCONCLUSIVE", "OK", "OK"]
    assert state.repeats.reproduced is False
    assert state.failing is None and state.attribution is None
    assert state.sweep.failing.trial == first


def test_every_depth_ok_leaves_no_threshold_and_nothing_to_repeat(tmp_path):
    stored = Stored(tmp_path)
    trials = [stored.add("OK", n) for n in (1, 2, 4)]
    state = triage(tmp_path).run()
    assert [ref.trial for ref in state.sweep.probed] == trials
    assert (state.sweep.threshold, state.sweep.deepest_ok) == (None, 4)
    assert state.repeats is None and state.bisection is None


def test_a_budget_spent_before_training_started_stops_the_triage(tmp_path):
    stored = Stored(tmp_path)
    stored.add("OK", 1)
    building = [{"t": 1.0, "seq": 0, "kind": "start", "phase": "build"}]
    late = stored.add("SLOW", 2, events=building, kill_reason="budget")
    state = triage(tmp_path).run()
    assert state.stages_done == ["env", "checks"]
    assert state.stopped == (f"stopped in the sweep stage: the {PLANNED_S:.0f} s budget of "
                             f"{late} ran out before training started (starting Python, "
                             f"importing torch and building the model took longer), so its "
                             f"verdict decides nothing: raise --budget")
    with pytest.raises(TriageStop, match="ran out before training started"):
        triage(tmp_path).sweep()


@pytest.mark.parametrize("options, message", [
    ({"max_layers": 0}, "max-layers: must be a positive integer, got 0"),
    ({"max_minutes": 0.0}, "max-minutes: must be > 0, got 0"),
    ({"world_size": 0}, "world-size: must be an integer >= 1, got 0"),
])
def test_options_out_of_range_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        TriageOptions(**options).validate()


def test_the_built_in_target_varies_every_knob_with_its_spec_values():
    assert accepted_knobs(BASE) == list(BASELINE)
    assert spec_knobs(BASE.replace(branches=("cmp", "win")), world_size=2) == {
        "grad_ckpt": True, "dtype": "bfloat16", "backend": None, "branches": ["cmp", "win"],
        "seq_len": 64, "world_size": 2}
