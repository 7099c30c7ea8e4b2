"""The pure decisions of a triage: threshold search, delta debugging, confidence, time
limits, knob differences, environment problems and time attribution."""

import itertools

import pytest

from nsadiag.envinfo import EnvReport
from nsadiag.triage.decide import (
    BASELINE,
    MIN_TRIAL_BUDGET_S,
    TRIAL_OVERHEAD_S,
    OutOfTime,
    TimeLimit,
    attribute_time,
    baseline_values,
    bracket,
    by_layer_pattern,
    confidence,
    ddmin,
    env_problems,
    find_threshold,
    knob_changes,
    needs_repeat,
    plan_trial_budget,
    reproduced,
    time_by_module,
)
from tests.helpers import evidence_of

# ---- threshold search ---------------------------------------------------------------------


def _counting(threshold):
    asked = []

    def fails(n):
        asked.append(n)
        return threshold is not None and n >= threshold
    return fails, asked


@pytest.mark.parametrize("max_depth", [1, 2, 5, 8, 12, 33])
def test_threshold_is_found_exactly_for_every_position(max_depth):
    for threshold in [*range(1, max_depth + 1), None]:
        fails, asked = _counting(threshold)
        found = find_threshold(fails, max_depth)
        assert found.threshold == threshold
        expected_ok = (threshold - 1 if threshold else max_depth) or None
        assert found.deepest_ok == expected_ok
        assert len(asked) == len(set(asked)), "a depth was probed twice"
        # exponential growth then binary search: about 2 log2(max_depth) probes at most
        assert len(asked) <= 2 * max(1, (max_depth - 1).bit_length()) + 1


def test_threshold_search_grows_exponentially_then_bisects():
    fails, asked = _counting(6)
    found = find_threshold(fails, 12)
    assert asked == [1, 2, 4, 8, 6, 5]
    assert found.probed == [(1, False), (2, False), (4, False), (8, True), (6, True),
                            (5, False)]


def test_threshold_search_ends_at_max_depth_when_it_is_no_power_of_two():
    fails, asked = _counting(None)
    assert find_threshold(fails, 6).threshold is None
    assert asked == [1, 2, 4, 6]


def test_failure_at_one_layer_needs_one_probe():
    fails, asked = _counting(1)
    found = find_threshold(fails, 16)
    assert (found.threshold, found.deepest_ok, asked) == (1, None, [1])


def test_an_interrupted_search_leaves_a_bracket():
    from nsadiag.triage.decide import OutOfTime as Stop

    probed = {}

    def fails(n):
        if len(probed) == 4:
            raise Stop("no time")
        probed[n] = n >= 6
        return probed[n]

    with pytest.raises(Stop):
        find_threshold(fails, 12)
    assert probed == {1: False, 2: False, 4: False, 8: True}
    assert bracket(probed) == (4, 8)
    assert bracket({1: False, 2: False}) == (2, None)
    assert bracket({}) == (None, None)


def test_max_depth_must_be_positive():
    with pytest.raises(ValueError, match="max_depth"):
        find_threshold(lambda n: True, 0)


# ---- delta debugging ----------------------------------------------------------------------


def _culprits_fail(culprits, asked):
    """Fails when every culprit is applied (an interaction of all of them)."""
    def fails(subset):
        asked.append(subset)
        return set(culprits) <= subset
    return fails


CHANGES = ["grad_ckpt", "dtype", "backend", "branches", "seq_len", "world_size"]


@pytest.mark.parametrize("size", [1, 2, 3])
def test_ddmin_finds_exactly_the_interacting_changes(size):
    for culprits in itertools.combinations(CHANGES, size):
        asked = []
        found = ddmin(CHANGES, _culprits_fail(culprits, asked))
        assert found == [c for c in CHANGES if c in culprits]
        assert frozenset(CHANGES) not in asked, "the known failing set was run again"
        assert len(asked) == len(set(asked)), "a subset was run twice"


def test_ddmin_with_one_change_asks_only_the_baseline():
    asked = []
    assert ddmin(["seq_len"], _culprits_fail(["seq_len"], asked)) == ["seq_len"]
    assert asked == [frozenset()]


def test_ddmin_returns_nothing_when_the_baseline_fails_too():
    asked = []
    assert ddmin(CHANGES, lambda s: asked.append(s) or True) == []
    assert asked == [frozenset()]


def test_ddmin_result_is_one_minimal_for_alternative_causes():
    """Either dtype or seq_len alone fails: the answer is one of them, and removing it
    passes."""
    def fails(subset):
        return "dtype" in subset or "seq_len" in subset

    found = ddmin(CHANGES, fails)
    assert len(found) == 1 and found[0] in ("dtype", "seq_len")
    assert not fails(frozenset(found) - {found[0]})


# ---- repeats ------------------------------------------------------------------------------


def test_confidence_counts_agreeing_repeats():
    steady = confidence(["SLOW", "SLOW"])
    assert (steady.verdict, steady.text(), steady.flaky) == ("SLOW", "2 of 2", False)
    flaky = confidence(["DEADLOCK", "OK", "DEADLOCK"])
    assert (flaky.verdict, flaky.text(), flaky.flaky) == ("DEADLOCK", "2 of 3", True)
    assert flaky.to_dict()["flaky"] is True


def test_a_tie_goes_to_the_failure():
    assert confidence(["OK", "ERROR"]).verdict == "ERROR"
    assert confidence(["OK", "ERROR"]).text() == "1 of 2"
    with pytest.raises(ValueError):
        confidence([])


def test_a_timing_verdict_counts_only_when_the_repeats_confirm_a_failure():
    assert not reproduced("SLOW", confidence(["SLOW", "OK", "OK"]))
    assert not reproduced("STALL-BUSY", confidence(["STALL-BUSY", "INCONCLUSIVE",
                                                    "INCONCLUSIVE"]))
    assert reproduced("SLOW", confidence(["SLOW", "SLOW"]))
    assert reproduced("STALL-BUSY", confidence(["STALL-BUSY", "OK", "DEADLOCK"]))
    # a crash or a deadlock seen once is real, whatever the repeats say
    assert reproduced("CRASH", confidence(["CRASH", "OK", "OK"]))
    assert reproduced("DEADLOCK", confidence(["DEADLOCK", "OK", "OK"]))


def test_repeats_confirm_once_and_chase_a_flaky_verdict_up_to_the_limit():
    assert needs_repeat(["SLOW"])
    assert not needs_repeat(["SLOW", "SLOW"])
    assert needs_repeat(["SLOW", "OK"])
    assert not needs_repeat(["SLOW", "OK", "SLOW"])
    assert needs_repeat(["SLOW", "OK", "SLOW"], max_runs=5)
    assert not needs_repeat(["SLOW"], max_runs=1)


# ---- time limit ---------------------------------------------------------------------------


def test_trial_budget_is_planned_from_the_time_limit():
    # 60 minutes over 12 trials: 300 s each, less the overhead
    assert plan_trial_budget(60, 600, planned_trials=12) == 300 - TRIAL_OVERHEAD_S
    assert plan_trial_budget(60, 30, planned_trials=12) == 30  # the user's budget is smaller
    # a short limit never plans below the floor that pays for starting a trial ...
    assert plan_trial_budget(0.5, 600, planned_trials=12) == MIN_TRIAL_BUDGET_S
    # ... unless the user asked for less
    assert plan_trial_budget(0.5, 8, planned_trials=12) == 8


def test_time_limit_hands_out_budgets_then_runs_out():
    limit = TimeLimit(deadline=200.0, planned_budget_s=60.0)
    assert limit.trial_budget(now=0.0) == 60.0
    # 45 s left: 35 s of budget plus the overhead still fits
    assert limit.trial_budget(now=155.0) == 45.0 - TRIAL_OVERHEAD_S
    with pytest.raises(OutOfTime, match="left"):
        limit.trial_budget(now=200.0 - TRIAL_OVERHEAD_S - MIN_TRIAL_BUDGET_S + 0.5)
    assert limit.remaining(40.0) == 160.0
    # a user budget below the floor: the floor is the user's budget
    short = TimeLimit(deadline=100.0, planned_budget_s=8.0)
    assert short.trial_budget(now=100.0 - TRIAL_OVERHEAD_S - 8.0) == 8.0
    with pytest.raises(OutOfTime):
        short.trial_budget(now=100.0 - TRIAL_OVERHEAD_S - 7.5)


# ---- configurations -----------------------------------------------------------------------


def test_knob_changes_are_the_accepted_knobs_off_the_baseline():
    failing = dict(grad_ckpt=True, dtype="bfloat16", backend="naive", branches=None,
                   seq_len=2048, world_size=1, n_layers=5)
    every = set(BASELINE)
    assert knob_changes(failing, every) == dict(grad_ckpt=True, dtype="bfloat16",
                                                backend="naive", seq_len=2048)
    # a factory that takes neither grad_ckpt nor backend: only what the trial controls
    assert knob_changes(failing, {"dtype", "seq_len"}) == dict(dtype="bfloat16", seq_len=2048)
    # a sequence already shorter than the baseline's is no change
    assert knob_changes(dict(failing, seq_len=32), {"seq_len"}) == {}
    assert baseline_values(failing, dict(dtype="bfloat16", seq_len=2048)) == dict(
        dtype="float32", seq_len=BASELINE["seq_len"])


def test_env_problems_name_what_weakens_the_evidence():
    healthy = dict(py_spy="py-spy 0.4.0", ptrace="allowed (ptrace_scope=0)", devices=[],
                   cuda="not available", torch_threads=2, cpu_count=2)
    assert env_problems(EnvReport.from_dict(healthy), "cpu") == []
    broken = dict(healthy, py_spy="not found (pip install py-spy)",
                  ptrace="refused (ptrace_scope=3): py-spy cannot attach", torch_threads=16)
    problems = env_problems(EnvReport.from_dict(broken), "cuda")
    assert len(problems) == 4
    assert "without stack samples" in problems[0]
    assert "refused" in problems[1]
    assert "cuda requested" in problems[2]
    assert "16 threads on 2 CPUs" in problems[3]


def test_a_loaded_machine_is_named_as_a_problem():
    env = dict(py_spy="py-spy 0.4.0", ptrace="allowed (ptrace_scope=0)", devices=[],
               cuda="not available", torch_threads=2, cpu_count=8, usable_cpus=2)
    assert env_problems(EnvReport.from_dict({**env, "load_average": [2.9, 2.0, 1.0]}),
                        "cpu") == []
    problems = env_problems(EnvReport.from_dict({**env, "load_average": [7.0, 6.5, 4.0]}),
                            "cpu")
    assert problems == ["the machine is loaded: load average 7.0 on 2 usable CPU(s): timings "
                        "stretch, and a timing verdict (SLOW, STALL-BUSY) may read "
                        "INCONCLUSIVE or not reproduce"]


# ---- where the time goes ------------------------------------------------------------------


def _event(t, module, phase, edge):
    return dict(t=t, kind="module", module=module, phase=phase, edge=edge)


def test_time_by_module_sums_innermost_intervals_and_closes_open_ones():
    events = [
        dict(t=0.0, kind="start", phase="forward"),
        _event(0.0, "blocks.0", "forward", "enter"),
        _event(0.1, "blocks.0.attn.sel", "forward", "enter"),
        _event(0.7, "blocks.0.attn.sel", "forward", "exit"),
        _event(0.8, "blocks.0.attn.win", "forward", "enter"),
        _event(0.9, "blocks.0.attn.win", "forward", "exit"),
        _event(1.0, "blocks.0", "forward", "exit"),
        _event(1.0, "blocks.1", "forward", "enter"),
        _event(1.0, "blocks.1.attn.sel", "forward", "enter"),
        _event(1.5, "blocks.1.attn.sel", "forward", "exit"),
        _event(2.0, "blocks.1.attn.sel", "backward", "enter"),  # still running at the kill
    ]
    times = {(t.module, t.phase): t for t in time_by_module(events, end=3.0)}
    assert "blocks.0" not in {m for m, _ in times}, "a block with branch events is not inner"
    assert times["blocks.0.attn.sel", "forward"].seconds == pytest.approx(0.6)
    assert times["blocks.1.attn.sel", "backward"].seconds == pytest.approx(1.0)
    assert times["blocks.1.attn.sel", "backward"].open == 1
    grouped = by_layer_pattern(time_by_module(events, end=3.0))
    assert (grouped[0].module, grouped[0].phase) == ("blocks.*.attn.sel", "forward")
    assert grouped[0].seconds == pytest.approx(1.1)
    assert [g.module for g in grouped] == ["blocks.*.attn.sel", "blocks.*.attn.sel",
                                           "blocks.*.attn.win"]


def test_attributed_time_is_a_share_of_the_kept_events_span_even_past_the_stop():
    # the evidence kept the last events of a long run; the runner decided to stop at 10.5,
    # sampled the stacks, and the child went on until 12.0
    events = [dict(t=10.0, kind="module", module="blocks.0", phase="forward", edge="exit")]
    for step in range(4):
        t = 10.0 + 0.5 * step
        events += [_event(t, "blocks.0", "backward", "enter"),
                   _event(t + 0.4, "blocks.0", "backward", "exit")]
    found = attribute_time(evidence_of({}, {
        "events": events, "outcome": {"exit_code": 0, "ended_at": 10.5},
        "event_counts": {"module": 3000, "step": 500, "pulse": 40}}))
    assert found.span_s == pytest.approx(1.9)
    assert (found.events, found.events_total) == (9, 3500)
    backward = found.by_pattern[0]
    assert (backward.module, backward.phase) == ("blocks.*", "backward")
    assert backward.seconds == pytest.approx(1.6) and backward.seconds <= found.span_s
    # a run whose events were all kept, stopped after its last event
    whole = attribute_time(evidence_of({}, {
        "events": events, "outcome": {"exit_code": 0, "ended_at": 13.0},
        "event_counts": {"module": 9}}))
    assert whole.span_s == pytest.approx(3.0) and whole.events_total == 9
