"""A SLOW verdict from hand-built evidence (nsadiag.verdict.slow.slow_verdict): the pace,
the part done, the ETA and the last step's time, each said from the heartbeat events; a
trial whose slowness only time supports on a contended machine is INCONCLUSIVE, a user's
command at its deadline stays SLOW, and a run many times slower than contention can make
it stays SLOW whatever the load."""

from typing import Any

import pytest

from nsadiag.evidence import Evidence, ProcessOutcome
from nsadiag.verdict.load import contention, stretch_limit
from nsadiag.verdict.rules import decide
from nsadiag.verdict.slow import slow_verdict
from nsadiag.verdict.thresholds import LOADED_PER_CPU, MIN_RATE_SPAN_S, RATE_WINDOW_S

T0 = 1000.0
SPACING_S = 0.5  # one block entry or exit every half second: 2 per second
MODULE_EVENTS = 20
PER_STEP = 8
TOTAL_STEPS = 10
LAST_EVENT_T = T0 + (MODULE_EVENTS - 1) * SPACING_S
KILLED_AT = LAST_EVENT_T + 0.5


def _module_events() -> list[dict[str, Any]]:
    return [{"t": T0 + i * SPACING_S, "seq": i + 1, "kind": "module", "phase": "forward",
             "step": 1, "module": "blocks.0", "edge": "enter" if i % 2 == 0 else "exit"}
            for i in range(MODULE_EVENTS)]


STEP_0 = {"t": T0 + 4.0, "seq": 100, "kind": "step", "step": 0, "step_s": 4.0,
          "forward_s": 1.5, "backward_s": 2.5}


def budget_killed(spec: dict[str, Any] | None = None, extra: list[dict] = (),
                  load: dict[str, Any] | None = None) -> Evidence:
    """A trial the runner's budget stopped while its blocks still moved: 20 block entries and
    exits 0.5 s apart (8 a step, 10 steps asked), step 0 timed, the kill 0.5 s after the
    last event."""
    events = sorted([*_module_events(), STEP_0, *extra], key=lambda e: e["t"])
    return Evidence(
        spec=spec or {"target": "nsa", "seq_len": 64, "stall_timeout_s": 5.0},
        events=events, event_counts={"module": MODULE_EVENTS, "step": 1}, result=None,
        outcome=ProcessOutcome(exit_code=None, signal=9, signal_name="SIGKILL",
                               killed_by_runner=True, kill_reason="budget", wall_s=12.0,
                               ended_at=KILLED_AT),
        stall=None, expected_events_per_step=PER_STEP, total_steps=TOTAL_STEPS,
        stall_timeout_s=5.0, load=load)


def loaded(per_cpu: float, cpus: int = 2) -> dict[str, Any]:
    """Load figures with ``per_cpu`` runnable tasks per usable CPU at start and end."""
    reading = {"loadavg": [per_cpu * cpus, per_cpu * cpus, per_cpu * cpus], "cpus": cpus}
    return {"start": reading, "end": reading}


def test_the_pace_part_done_eta_and_last_step_are_said_from_the_events():
    # the window of the rate holds every event, and they span more than the shortest span
    assert (MODULE_EVENTS - 1) * SPACING_S <= RATE_WINDOW_S
    assert (MODULE_EVENTS - 1) * SPACING_S >= MIN_RATE_SPAN_S
    verdict = slow_verdict(budget_killed(), gap=KILLED_AT - LAST_EVENT_T, window=5.0)
    assert verdict.name == "SLOW"
    first, *rest = verdict.reasons
    assert first == ("still progressing at the budget kill after 12.0 s: the last progress "
                     "(heartbeat or sampler pulse) came 0.5 s before the kill (within the "
                     "5.0 s stall window)")
    rate = 1 / SPACING_S  # entries and exits per second
    assert (f"{rate / PER_STEP:.3g} steps/s over the last 9.5 s ({rate:.1f} entries and exits "
            f"of the model's blocks per second, {PER_STEP} per step)") in rest
    expected = PER_STEP * TOTAL_STEPS
    assert (f"{MODULE_EVENTS / expected:.0%} done: {MODULE_EVENTS} of {expected} entries and "
            f"exits of the model's blocks ({PER_STEP} per step x {TOTAL_STEPS} steps)") in rest
    eta = (expected - MODULE_EVENTS) / rate
    assert f"ETA {eta:.0f} s for the remainder at that pace" in rest
    assert "step 0 took 4.0 s (forward 1.5 s, backward 2.5 s)" in rest


def test_an_unknown_time_of_the_last_progress_is_said_so():
    verdict = slow_verdict(budget_killed(), gap=None, window=5.0)
    assert verdict.name == "SLOW"
    assert verdict.reasons[0].endswith(
        "came at an unrecorded time, and the runner's stall watch had not fired")


def test_the_rule_chain_gives_a_budget_kill_of_a_progressing_run_this_verdict():
    evidence = budget_killed()
    direct = slow_verdict(evidence, gap=KILLED_AT - LAST_EVENT_T, window=5.0)
    assert decide(evidence).reasons[:len(direct.reasons)] == direct.reasons


def test_a_trial_slow_only_by_its_time_on_a_contended_machine_is_inconclusive():
    per_cpu = 2 * LOADED_PER_CPU
    found = contention(loaded(per_cpu))
    assert found is not None and found["contended"]
    verdict = slow_verdict(budget_killed(load=loaded(per_cpu)), gap=0.5, window=5.0)
    assert verdict.name == "INCONCLUSIVE"
    assert verdict.reasons[-1].endswith("SLOW here must be confirmed on a quieter machine")
    assert any(r.startswith("the machine was contended") for r in verdict.reasons)
    quiet = slow_verdict(budget_killed(load=loaded(LOADED_PER_CPU / 4)), gap=0.5, window=5.0)
    assert quiet.name == "SLOW"
    assert any(r.startswith("the machine was not contended") for r in quiet.reasons)


def test_a_users_command_at_its_deadline_stays_slow_on_a_contended_machine():
    spec = {"command": ["python", "train.py"], "subject": "the command", "stall_timeout_s": 5.0}
    verdict = slow_verdict(budget_killed(spec, load=loaded(2 * LOADED_PER_CPU)), gap=0.5,
                           window=5.0)
    assert verdict.name == "SLOW"
    assert verdict.reasons[0].startswith("still progressing at the deadline kill after 12.0 s")
    assert any(r.startswith("the machine was contended") for r in verdict.reasons)


@pytest.mark.parametrize("expected_step_s, name", [(0.01, "SLOW"), (4.0, "INCONCLUSIVE")])
def test_a_step_far_slower_than_its_shape_outgrows_what_contention_explains(expected_step_s,
                                                                            name):
    # a forward started 5 s before the kill; a dense step of this shape takes expected_step_s
    started = {"t": KILLED_AT - 5.0, "seq": 200, "kind": "start", "phase": "forward",
               "step": 1, "expected_step_s": expected_step_s}
    load = loaded(2 * LOADED_PER_CPU)
    limit = stretch_limit(contention(load))
    factor = 5.0 / expected_step_s
    assert (factor > limit) is (name == "SLOW")
    verdict = slow_verdict(budget_killed(extra=[started], load=load), gap=0.5, window=5.0)
    assert verdict.name == name
    said = (f"step 1 has run 5 s, {factor:,.0f}x what a step of dense blocks of this shape "
            f"takes here ({expected_step_s:.2f} s)")
    assert any(said in reason for reason in verdict.reasons)
    explained = "contention does not explain the slowness" if name == "SLOW" else \
        "contention alone could explain it"
    assert any(explained in reason for reason in verdict.reasons)
