"""A SLOW verdict's facts (pure): how fast the run went, how far it got, when it would end, and
whether it is slow by its size or by a defect.

The rule chain (nsadiag.verdict.rules.rule_budget) picks SLOW for a run its limit stopped
while it still progressed; ``slow_verdict`` then states, each where it was measured:

- the rate (steps per second at the end, from the blocks' entries and exits) and the
  fraction done (nsadiag.verdict.progress);
- the ETA of the run, or where the current loop stands by its loop counter and how long
  this pass has left;
- the last step's time (forward and backward);
- slow by size or by defect from the counts of one forward, or from a per-token loop in
  the sampled profile (nsadiag.verdict.size_or_defect), with the achieved FLOP/s beside a
  dense block's;
- the hot frame (of the sampled profile, else of the samples at the kill) and the
  profile's sentences;
- the slow cause's class when the evidence names one: data-bound, recompiles,
  checkpoint recompute (nsadiag.verdict.slow_cause);
- how many times slower than its shape should take the run was, and whether the machine's
  load can explain it.

What to do next is the finding's (nsadiag.finding.trial.next_action): one next step per
report, from the facts stated here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nsadiag.evidence import Evidence
from nsadiag.fmt import rounded_duration
from nsadiag.probes.efficiency import step_cost
from nsadiag.probes.loops import loop_location
from nsadiag.verdict.facts import add_hot_frame, add_load, add_profile, position_facts, words
from nsadiag.verdict.load import explains
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.progress import Progress, progress
from nsadiag.verdict.size_or_defect import find_token_loop, slow_by, token_loop
from nsadiag.verdict.slow_cause import add_slow_cause


def slow_verdict(evidence: Evidence, gap: float | None, window: float) -> Verdict:
    """SLOW for a run the limit stopped while it progressed (the last progress came ``gap``
    seconds before the kill, within the stall ``window``), with what the module docstring
    lists; INCONCLUSIVE naming SLOW on a contended machine when nothing but time supports
    it (a trial's budget, not a user's deadline)."""
    counts = evidence.event_counts
    outcome = evidence.outcome
    started = outcome.ended_at - outcome.wall_s if outcome.ended_at is not None else None
    p = progress(evidence.events, evidence.expected_events_per_step, evidence.total_steps,
                 module_events_done=counts.get("module"), started_t=started,
                 ended_t=outcome.ended_at)
    facts = {**position_facts(evidence), "rate": p.rate, "rate_window_s": p.window_s,
             "fraction_done": p.fraction, "eta_s": p.eta_s, "events_done": p.events_done,
             "events_expected": p.events_expected, "fraction_basis": p.basis,
             "since_last_event_s": gap}
    when = ("at the kill itself (it went on while its stacks were sampled)" if gap == 0.0 else
            f"{gap:.1f} s before the kill (within the {window:.1f} s stall window)"
            if gap is not None else
            "at an unrecorded time, and the runner's stall watch had not fired")
    reasons = [f"still progressing at {words(evidence).limit} kill after "
               f"{evidence.outcome.wall_s:.1f} s: the last progress (heartbeat or sampler "
               f"pulse) came {when}"]
    if p.rate is not None:
        reasons.append(_rate_sentence(p.rate, p.window_s, evidence.expected_events_per_step))
    reasons.append(_fraction_sentence(p, evidence))
    seq_len = int(evidence.spec.get("seq_len") or 0)
    loop = find_token_loop(evidence.profile, seq_len) or _moving_loop(evidence.profile)
    reasons.append(_eta_sentence(p, loop, facts))
    steps = [event for event in evidence.events if event.get("kind") == "step"]
    if steps and "step_s" in steps[-1]:
        facts["step_s"] = steps[-1]["step_s"]
        reasons.append(_step_sentence(steps[-1]))
    measured = _work_measured(evidence.events)
    if measured is not None:
        _add_efficiency(measured, evidence, facts, reasons)
    _add_token_loop(evidence, facts, reasons)
    samples = evidence.stall.samples if evidence.stall else []
    hot_lines = (evidence.profile or {}).get("hot_lines") or []
    # hundreds of samples over the run name where the time went; the few taken at the kill
    # name only where the run happened to be (in backward: the autograd engine)
    add_hot_frame(samples, facts, reasons, at_kill=bool(hot_lines))
    add_profile(evidence.profile, facts, reasons)
    add_slow_cause(evidence, facts, reasons)
    if hot_lines:
        facts.update(hot_frame=hot_lines[0]["where"], hot_share=hot_lines[0]["fraction"],
                     hot_code=hot_lines[0].get("code"), hot_source="profile")
    slowness = _slowness(evidence, measured, steps[-1] if steps else None)
    if slowness is not None:
        facts["slowness"] = slowness
    load = add_load(evidence.load, facts, reasons, slowness,
                    counted=facts.get("slow_by") is not None)
    # a trial's budget is nsadiag's choice, so a SLOW nothing but its time supports must
    # survive a quieter machine, unless it is slower than contention can make a run; a
    # user's command at its own deadline did not finish, and the load figures beside it
    # say how busy the machine was
    if load and load["contended"] and facts.get("slow_by") is None and \
            not words(evidence).users_own and \
            (slowness is None or explains(load, slowness["factor"]) is not False):
        return Verdict("INCONCLUSIVE", [*reasons, "no count (host reads per token, FLOPs per "
                                        "op) ties the slowness to a defect, and contention "
                                        "alone can stretch a run past its limit: SLOW here "
                                        "must be confirmed on a quieter machine"],
                       {**facts, "would_be": "SLOW", "contended": True})
    return Verdict("SLOW", reasons, facts)


def _fraction_sentence(p: Progress, evidence: Evidence) -> str:
    if p.fraction is None:
        return "fraction done unknown: no step count"
    if p.events_expected is not None:
        return (f"{p.fraction:.0%} done: {p.events_done} of {p.events_expected} entries and "
                f"exits of the model's blocks ({evidence.expected_events_per_step} per step x "
                f"{evidence.total_steps} steps)")
    return f"{p.fraction:.0%} done by steps and the position inside the current step"


def _rate_sentence(rate: float, window_s: float | None, per_step: int | None) -> str:
    """The pace the hooks counted, in steps where a step's count was measured: what a person
    compares with the steps still to go."""
    over = f" over the last {window_s:.1f} s" if window_s else ""
    if not per_step:
        return f"{rate:.1f} entries and exits of the model's blocks per second{over}"
    return (f"{rate / per_step:.3g} steps/s{over} ({rate:.1f} entries and exits of the "
            f"model's blocks per second, {per_step} per step)")


def _step_sentence(step: dict[str, Any]) -> str:
    forward, backward = step.get("forward_s", 0.0), step.get("backward_s", 0.0)
    return (f"step {step.get('step')} took {step['step_s']:.1f} s (forward {forward:.1f} s, "
            f"backward {backward:.1f} s)")


def _moving_loop(profile: dict[str, Any] | None) -> dict[str, Any] | None:
    """The most advanced loop of the profile whose current pass has an end and a pace
    (its position can be told), read in forward or backward; None when there is none."""
    for loop in (profile or {}).get("loops") or []:
        if loop.get("end") and loop.get("pass_rate_per_s") and \
                loop.get("phase") in ("forward", "backward"):
            return loop
    return None


def _loop_sentence(loop: dict[str, Any], phase_now: str | None = None) -> str:
    """"forward of blocks.0 at t = 1,407 of 2,048, 3.7/s: about 3 min to finish this
    loop (model.py:57)"; when the last heartbeat put the process in another phase
    (``phase_now``: backward while the loop ran in forward) its pass had ended, and no time
    to finish it is claimed; nor when no heartbeat says which phase the process was in."""
    where = f"{loop['phase']} of {loop['module']}" if loop.get("module") else \
        f"in {loop['phase']}"
    position = f"{loop['variable']} = {int(loop['last']):,}"
    if loop.get("end"):
        position += f" of {int(loop['end']):,}"
    pace = loop.get("pass_rate_per_s") or loop.get("rate_per_s")
    sentence = f"{where} at {position}" + (f", {pace:.1f}/s" if pace else "")
    if phase_now and loop.get("phase") and phase_now != loop["phase"]:
        sentence += (f"; at the kill the process was in {phase_now}, past this loop's "
                     f"{loop['phase']} pass")
    elif loop.get("eta_s") is not None and phase_now is not None:
        # "about" an estimate of seconds or more; "under a second" is already a bound
        about = "" if loop["eta_s"] < 1 else "about "
        sentence += f": {about}{rounded_duration(loop['eta_s'])} to finish this loop"
    return f"{sentence} ({loop_location(loop)})"


def _eta_sentence(p: Progress, loop: dict[str, Any] | None, facts: dict) -> str:
    """The run's ETA when its steps give one; else what the loop counter says of the
    current pass; else that the ETA is unknown. The loop's position goes into facts."""
    if loop is not None and loop.get("end"):
        facts["loop_position"] = {key: loop.get(key) for key in (
            "variable", "last", "end", "pass_rate_per_s", "eta_s", "phase", "module",
            "where")}
    if p.eta_s is not None:
        sentence = f"ETA {p.eta_s:.0f} s for the remainder at that pace"
        return sentence + (f"; the loop counter: {_loop_sentence(loop, facts.get('last_phase'))}"
                           if "loop_position" in facts else "")
    if "loop_position" in facts:
        return (f"ETA of the whole run unknown (no finished step to extrapolate from); the "
                f"loop counter: {_loop_sentence(loop, facts.get('last_phase'))}")
    return "ETA unknown: no rate or no position to extrapolate from"


def _slowness(evidence: Evidence, measured: dict[str, Any] | None,
              step: dict[str, Any] | None) -> dict[str, Any] | None:
    """How many times slower than its shape should take here the run was ({"factor",
    "basis"}): the last finished step against its expected cost (nsadiag.probes.efficiency
    .step_cost), else the step still running at the kill against what a dense model of
    the trial's shape takes per step (the "expected_step_s" of its forward start); None
    when neither is known."""
    cost = step_cost(measured, step.get("step_s")) if measured and step else None
    if cost is not None:
        return {"factor": cost["ratio"], "basis": (
            f"step {step.get('step')} took {cost['ratio']:.1f}x the time a dense block "
            f"takes here for its FLOPs ({step['step_s']:.1f} s against "
            f"{cost['expected_s']:.2f} s)")}
    starts = [e for e in evidence.events if e.get("kind") == "start" and
              e.get("phase") == "forward"]
    expected = next((e["expected_step_s"] for e in reversed(evidence.events)
                     if e.get("expected_step_s")), None)
    ended = evidence.outcome.ended_at
    if not starts or not expected or ended is None:
        return None
    running = ended - starts[-1]["t"]
    factor = running / expected
    return {"factor": factor, "basis": (
        f"step {starts[-1].get('step')} has run {running:.0f} s, {factor:,.0f}x what a step "
        f"of dense blocks of this shape takes here ({expected:.2f} s)")}


def _work_measured(events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The latest work count of the run: the last step event carrying one (it has the
    step's efficiency too), else the backward start of step 0, written as soon as the
    counted forward ended (a run cut off inside its first backward still has it)."""
    for event in reversed(events):
        counted = "host_reads_per_step" in event or "rates_unavailable" in event
        if counted and (event.get("kind") == "step" or
                        (event.get("kind") == "start" and event.get("phase") == "backward")):
            return event
    return None


def _add_efficiency(measured: dict[str, Any], evidence: Evidence, facts: dict,
                    reasons: list[str]) -> None:
    """Slow by size or by defect from the counts of one forward (nsadiag.verdict.size_or_defect),
    with the achieved FLOP/s and efficiency beside a dense block's when a step was timed."""
    verdict, findings = slow_by(measured, int(evidence.spec.get("seq_len") or 0))
    if verdict is None:
        if measured.get("rates_unavailable"):
            reasons.append(f"slow by size or defect unknown: {measured['rates_unavailable']}")
        return
    efficiency, reference = measured.get("efficiency"), measured.get("dense_efficiency")
    rate, flops = measured.get("machine_flops_per_s"), measured.get("flops_per_step")
    facts.update(efficiency=efficiency, dense_efficiency=reference, flops_per_step=flops,
                 machine_flops_per_s=rate, slow_by=verdict, slow_findings=findings,
                 host_reads_per_step=measured.get("host_reads_per_step"),
                 flops_per_op=measured.get("flops_per_op"))
    figures = []
    if flops:
        figures.append(f"{flops / 1e9:.2f} GFLOP per step")
    if efficiency is not None and rate:
        share = f"{efficiency:.2%}" if efficiency < 0.01 else f"{efficiency:.1%}"
        figures.append(f"{efficiency * rate / 1e9:.2f} GFLOP/s, {share} of this "
                       f"machine's matmul rate ({rate / 1e9:.0f} GFLOP/s)")
    if reference:
        figures.append(f"a dense transformer block of the same shape reaches {reference:.1%}")
    shown = "; ".join(figures)
    if verdict == "defect":
        reasons.append(f"slow by defect: {'; '.join(findings)}" + (f" ({shown})" if shown
                                                                  else ""))
        return
    timed = measured.get("kind") == "step" and measured.get("step_s")
    left = (f" ({max(0, evidence.total_steps - int(measured.get('step', 0)) - 1)} more "
            f"steps at {measured['step_s']:.1f} s each)" if timed else "")
    reasons.append("slow by size: no host read per token and ops the size of a dense "
                   "block's" + (f" ({shown})" if shown else "") +
                   f": the work itself outlasts the budget{left}")


def _add_token_loop(evidence: Evidence, facts: dict, reasons: list[str]) -> None:
    """Slow by defect from the sampled profile when it shows a Python loop over the tokens
    (nsadiag.verdict.size_or_defect.token_loop) and no count said defect already: a forward of
    such a loop can outlast the budget before its work was counted."""
    found = token_loop(evidence.profile, int(evidence.spec.get("seq_len") or 0))
    if found is None or facts.get("slow_by") == "defect":
        return
    facts.update(slow_by="defect", slow_findings=[*facts.get("slow_findings", []), found])
    reasons[:] = [reason for reason in reasons if not reason.startswith("slow by size")]
    reasons.append(f"slow by defect: {found}, read from the model's own loop counter "
                   f"before any forward was counted")
