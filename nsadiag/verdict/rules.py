"""The verdict rules: evidence -> verdict, with the measured facts and the reasons that decided it.

Pure functions: no I/O, no clock. ``decide`` tries the rules below in order and the first
that applies names the verdict; every reason is a sentence tied to a measured fact.

1. ``rule_ok``         result status ok and exit 0                          -> OK
2. ``rule_exception``  an exception in the result                           -> OOM | ERROR
3. ``rule_signal``     a signal the runner did not send (or the OOM killer) -> OOM | CRASH
4. ``rule_budget``     the runner's time budget ran out                      -> SLOW, or a
                       stall verdict when progress had stopped before the kill
5. ``rule_stall``      the runner saw no progress for the stall timeout     -> STALL-COLLECTIVE
                       | STALL-BUSY | DEADLOCK, from CPU demand and stacks;
                       INCONCLUSIVE when a contended machine explains it
6. ``rule_exit_code``  anything else                                        -> ERROR

Progress is a heartbeat event (a block entered or left, a step, a collective) or a pulse of
the progress sampler that saw progress (a loop iterating inside one module, autograd nodes
running in backward). A timer firing is never a verdict by itself: a run still progressing
is SLOW, and a run that stopped is classified by what its process was doing.

The reasons speak of "the child" for a job nsadiag started (a trial, a check) and of "the
command" for a user's own command under ``nsadiag run`` (its evidence's spec names the
command), whose time limit is its deadline rather than a budget.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from nsadiag.evidence import Evidence, StackFrame, StackSample, StallEvidence, ThreadStack
from nsadiag.probes.efficiency import step_cost
from nsadiag.probes.frames import (
    busy_threads,
    classify,
    describe_place,
    find_collective,
    hot_frame,
    own_code,
    place_sentence,
    stacks_change,
    user_threads,
    wait_frame,
)
from nsadiag.probes.loops import loop_location
from nsadiag.probes.profile import describe as describe_profile
from nsadiag.verdict.known import explain_exception, is_oom_exception, project_frame
from nsadiag.verdict.load import contention, contention_sentence, explains
from nsadiag.verdict.progress import Progress, module_events, progress
from nsadiag.verdict.size_or_defect import find_token_loop, slow_by, token_loop
from nsadiag.verdict.thresholds import (
    BUSY_AT_ONE_LINE,
    BUSY_CPU_FRACTION,
    DEFAULT_STALL_WINDOW_S,
    IDLE_CPU_FRACTION,
    MIN_GROWTH_STEPS,
)

NAMES = ("OK", "SLOW", "INCONCLUSIVE", "STALL-COLLECTIVE", "STALL-BUSY", "DEADLOCK", "OOM",
         "ERROR", "CRASH", "WRONG")
"""Every verdict. WRONG comes from nsadiag.checks, never from a trial's evidence. INCONCLUSIVE
is a timing verdict (SLOW, STALL-BUSY) that did not reproduce or that machine contention
explains; it is never a failure."""

FAILURES = frozenset(NAMES) - {"OK", "INCONCLUSIVE"}
"""Verdicts that are a failure found (exit code 1), but for a SLOW by size (is_failure)."""


def is_failure(name: str, slow_by: str | None = None) -> bool:
    """Whether a verdict is a failure found: a name in FAILURES, except a SLOW by size (the
    work itself outlasts the time limit, done without a defect: big, not broken).
    ``slow_by`` is the verdict's fact of that name ("size", "defect" or None)."""
    return name in FAILURES and not (name == "SLOW" and slow_by == "size")



@dataclass
class Verdict:
    """``name`` is one of NAMES; ``reasons`` are sentences quoting measured facts;
    ``facts`` holds the numbers and names behind them (rate, eta_s, hot_frame, ...)."""

    name: str
    reasons: list[str]
    facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ValueError(f"Verdict.name: {self.name!r} is not one of {', '.join(NAMES)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)



@dataclass(frozen=True)
class _Words:
    """How reasons name the watched process and its limits."""

    who: str
    limit: str  # the wall-clock limit that ended a progressing run
    no_exception: str  # how a failure without a recorded exception is described
    runner: str  # who stops the process
    between: str  # what may sit between nsadiag and the Python process
    users_own: bool  # the user's own code and limits (nsadiag run, watch(), attach)


CHILD = _Words("the child", "the budget", "without writing an exception", "the runner",
               "a shell or launcher between the runner and the child", False)
COMMAND = _Words("the command", "the deadline", "without a Python traceback on stderr",
                 "nsadiag", "the shell or launcher that runs the command", True)


def words(evidence: Evidence) -> _Words:
    """CHILD for a trial's child; COMMAND for the user's own code (`nsadiag run`'s
    command, a block under watch(), an attached process), naming it by the spec's
    "subject" ("the command", "the watched block", "the process")."""
    spec = evidence.spec
    if "command" not in spec and "subject" not in spec:
        return CHILD
    return replace(COMMAND, who=str(spec.get("subject") or COMMAND.who))


def _thread_label(thread: ThreadStack) -> str:
    return thread.name or f"thread {thread.thread_id}"


def _waiting_thread(sample: StackSample) -> tuple[ThreadStack, StackFrame] | None:
    """The thread of ``sample`` blocked in a wait, the main thread first (nsadiag's own
    threads, which wait between samples, never)."""
    threads = sorted(user_threads(sample), key=lambda thread: thread.name != "MainThread")
    for thread in threads:
        frame = wait_frame(thread)
        if frame is not None:
            return thread, frame
    return None


# ---- helpers for reasons ------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _position(evidence: Evidence) -> dict[str, Any]:
    """Where the run was at its last heartbeat: module, edge, phase, step, steps done."""
    facts: dict[str, Any] = {"events_total": sum(evidence.event_counts.values()),
                             "steps_done": evidence.event_counts.get("step", 0)}
    modules = module_events(evidence.events)
    if modules:
        last = modules[-1]
        facts.update(last_module=last.get("module"), last_edge=last.get("edge"),
                     last_phase=last.get("phase"), last_step=last.get("step"))
    if evidence.events:
        facts["last_rss"] = evidence.events[-1].get("rss")
    return facts


def _position_sentence(facts: dict[str, Any]) -> str:
    if facts.get("last_module") is None:
        return f"no module heartbeat was recorded ({facts['events_total']} events in all)"
    return (f"last heartbeat: {facts['last_module']} {facts['last_edge']} in "
            f"{facts['last_phase']} of step {facts['last_step']} (steps finished: "
            f"{facts['steps_done']})")



def _signal_name(number: int, name: str | None) -> str:
    if name:
        return name
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"



# ---- the rules ----------------------------------------------------------------------------


def rule_ok(evidence: Evidence) -> Verdict | None:
    """OK: the child wrote a result with status ok and exited with status 0 (a user's
    command: it exited with status 0)."""
    result, outcome = evidence.result, evidence.outcome
    if not result or result.get("status") != "ok" or outcome.exit_code != 0:
        return None
    steps = result.get("steps_done")
    facts = {"steps_done": steps, "wall_s": outcome.wall_s, "peak_rss": result.get("peak_rss")}
    said = words(evidence)
    if said.users_own and evidence.total_steps:
        reasons = [f"{said.who} finished {steps} of {evidence.total_steps} steps in "
                   f"{outcome.wall_s:.1f} s"]
    elif said.users_own:
        reasons = [f"{said.who} exited with code 0 after {steps} training step(s) in "
                   f"{outcome.wall_s:.1f} s"]
    else:
        reasons = [f"the child finished {steps} of {evidence.total_steps} steps with status "
                   f"ok and exit code 0 in {outcome.wall_s:.1f} s"]
    timing = result.get("timing_steps")
    if timing:
        facts["timing_steps"] = timing
        reasons.append(f"then {timing} more step(s) for the step-time median, as the budget "
                       f"allowed")
    return Verdict("OK", reasons, facts)


def rule_exception(evidence: Evidence) -> Verdict | None:
    """OOM when the recorded exception names memory exhaustion (torch.OutOfMemoryError,
    MemoryError, "CUDA out of memory", "DefaultCPUAllocator: can't allocate memory",
    "not enough memory"); ERROR with type, message and the innermost project frame for any
    other exception."""
    exception = (evidence.result or {}).get("exception")
    if not exception:
        return None
    kind = str(exception.get("type", "Exception"))
    message = str(exception.get("message", "")).strip()
    first_line = message.splitlines()[0] if message else ""
    where = project_frame(str(exception.get("traceback", "")))
    facts = {**_position(evidence), "exception_type": kind, "message": first_line,
             "where": where, "peak_rss": (evidence.result or {}).get("peak_rss")}
    who = words(evidence).who
    reasons = [f"{who} raised {kind}: {first_line}"]
    if where:
        reasons.append(f"innermost project frame: {where}")
    explanation = explain_exception(kind, message)
    if explanation:
        facts.update(cause=explanation["cause"], fixes=explanation["fixes"])
        reasons.append(f"cause: {explanation['cause']}")
        reasons.append("fixes: " + "; ".join(explanation["fixes"]))
    if not is_oom_exception(exception, bool((evidence.result or {}).get("oom"))):
        return Verdict("ERROR", reasons, facts)
    if facts["peak_rss"]:
        reasons.append(f"peak RSS of {who} was {_gib(facts['peak_rss'])}")
    peak_cuda = (evidence.result or {}).get("peak_cuda")
    if peak_cuda:
        facts["peak_cuda"] = peak_cuda
        reasons.append(f"peak CUDA memory allocated was {_gib(peak_cuda)}")
    if evidence.outcome.memory_cap_bytes:
        reasons.append(f"the runner capped memory at {_gib(evidence.outcome.memory_cap_bytes)}")
    _add_memory_growth(evidence, facts, reasons)
    return Verdict("OOM", reasons, facts)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def memory_growth(events: Sequence[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The least-squares growth per step of ``key`` ("rss" or "cuda_alloc") at the step
    ends among ``events``: {"per_step", "steps", "first", "last"}; None with fewer than
    MIN_GROWTH_STEPS readings."""
    points = [(int(e.get("step", 0)), int(e[key])) for e in events
              if e.get("kind") == "step" and e.get(key) is not None]
    if len(points) < MIN_GROWTH_STEPS:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread <= 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return {"per_step": slope, "steps": len(points), "first": points[0][1],
            "last": points[-1][1]}


def _add_memory_growth(evidence: Evidence, facts: dict, reasons: list[str]) -> None:
    """How fast memory grew per step (heartbeat RSS at the step ends, and CUDA memory
    allocated where recorded) and the frame that keeps allocating across steps (the
    sampled profile's memory ledger), when known."""
    for key, label, ledger in (("rss", "resident memory", "rss"),
                               ("cuda_alloc", "CUDA memory allocated", "cuda")):
        growth = memory_growth(evidence.events, key)
        if growth is not None:
            facts[f"{key}_growth_per_step"] = growth["per_step"]
            reasons.append(f"{label} grew {_mib(growth['per_step'])} per step over the last "
                           f"{growth['steps']} steps (from {_mib(growth['first'])} to "
                           f"{_mib(growth['last'])} at the step ends)")
        holder = (((evidence.profile or {}).get("memory") or {}).get(ledger) or {}).get(
            "holder")
        if holder:
            code = f" `{holder['code']}`" if holder.get("code") else ""
            facts[f"{ledger}_holder"] = holder["where"]
            reasons.append(f"the frame that keeps allocating across steps: {holder['where']}"
                           f"{code} holds {_mib(holder['held'])} of {label}, taken in "
                           f"{holder['steps']} steps and not given back")


def rule_signal(evidence: Evidence) -> Verdict | None:
    """A signal the runner did not send: OOM for the kernel OOM killer or for SIGKILL under
    a memory cap; CRASH naming the signal otherwise (SIGSEGV, SIGABRT, SIGBUS, ...)."""
    outcome = evidence.outcome
    if outcome.killed_by_runner or (outcome.signal is None and not outcome.oom_killer):
        return None
    name = _signal_name(outcome.signal, outcome.signal_name) if outcome.signal else None
    facts = {**_position(evidence), "signal": outcome.signal, "signal_name": name,
             "memory_cap_bytes": outcome.memory_cap_bytes, "wall_s": outcome.wall_s}
    where = _position_sentence(facts)
    said = words(evidence)
    if outcome.oom_killer:
        reasons = [f"the kernel OOM killer killed {said.who} ({name or 'no signal'} "
                   f"recorded) after {outcome.wall_s:.1f} s", where]
        _add_memory_growth(evidence, facts, reasons)
        return Verdict("OOM", reasons, facts)
    if name == "SIGKILL" and outcome.memory_cap_bytes:
        rss = facts.get("last_rss")
        reasons = [f"{said.who} died of SIGKILL, not sent by {said.runner}, under a memory cap "
                   f"of {_gib(outcome.memory_cap_bytes)}: the kernel kills at the cap", where]
        if rss:
            reasons.append(f"RSS at the last heartbeat was {_gib(rss)}")
        _add_memory_growth(evidence, facts, reasons)
        return Verdict("OOM", reasons, facts)
    reasons = [f"{said.who} died of {name} (signal {outcome.signal}) after "
               f"{outcome.wall_s:.1f} s {said.no_exception}", where]
    _add_crash(evidence, facts, reasons)
    if name == "SIGKILL":
        reasons.append(f"no memory cap was set and no OOM kill was recorded: something outside "
                       f"{said.runner} sent SIGKILL")
    return Verdict("CRASH", reasons, facts)


def _add_crash(evidence: Evidence, facts: dict, reasons: list[str]) -> None:
    """What the process left when it died (nsadiag.harness.crash): its fatal-error dump's
    frame and the last words of native code on stderr."""
    crash = evidence.crash
    if not crash:
        return
    facts["crash"] = crash
    if crash.get("error") or crash.get("where"):
        inside = f" in {crash['call']}" if crash.get("call") else ""
        under = f", called from {crash['where']}" if crash.get("where") else ""
        if crash.get("thread") == "main" and (inside or under):
            inside = f" (a native thread took the signal; the main thread was{inside}"
            under += ")"
        error = (f"\"Fatal Python error: {crash['error']}\"" if crash.get("error") else
                 "a dump")
        reasons.insert(1, f"its faulthandler dump: {error}{inside}{under}")
    if crash.get("stderr"):
        reasons.insert(2 if len(reasons) > 2 else len(reasons),
                       "stderr: " + " / ".join(crash["stderr"]))


def last_progress_t(evidence: Evidence) -> float | None:
    """Time of the last progress: the last heartbeat event or the last sampler pulse that
    saw progress, whichever came later; None when neither was recorded."""
    times = [event["t"] for event in evidence.events if "t" in event]
    times += [pulse["t"] for pulse in evidence.pulses if pulse.get("progress") and "t" in pulse]
    return max(times, default=None)


def _gap_before_end(evidence: Evidence) -> float | None:
    """Seconds from the last progress to the end of the process, None when unknown; 0 when
    progress came after the end (ended_at is when the runner decided to stop, and the
    process went on while its stacks were sampled)."""
    last = last_progress_t(evidence)
    if last is not None and evidence.outcome.ended_at is not None:
        return max(0.0, evidence.outcome.ended_at - last)
    if evidence.stall is not None:
        return evidence.stall.since_last_event_s
    return None


def _stall_window(evidence: Evidence) -> float:
    return evidence.stall_timeout_s or DEFAULT_STALL_WINDOW_S


def rule_budget(evidence: Evidence) -> Verdict | None:
    """The budget ran out. SLOW, with rate, fraction done, ETA and hot frame, when the last
    progress came within the stall window before the kill (or the kill time is unknown:
    then the runner's stall watch had not fired; or the watcher measured less CPU
    opportunity than the window since then: a loaded machine, not a stop); otherwise
    progress had stopped and the stall rules classify what the process was doing."""
    outcome = evidence.outcome
    if not (outcome.killed_by_runner and outcome.kill_reason == "budget"):
        return None
    limit = words(evidence).limit
    finished = _asked_steps_finished(evidence)
    if finished is not None:
        return finished
    gap, window = _gap_before_end(evidence), _stall_window(evidence)
    if last_progress_t(evidence) is None and outcome.wall_s < window:
        return _still_starting(evidence, window)
    if last_progress_t(evidence) is None:
        return _stall_verdict(evidence, [f"{limit} ran out after {outcome.wall_s:.1f} s "
                                         f"before any heartbeat or progress pulse"])
    opportunity = evidence.stall.opportunity_s if evidence.stall else None
    if gap is not None and gap > window and (opportunity is None or opportunity > window):
        return _stall_verdict(evidence, [
            f"{limit} ran out after {outcome.wall_s:.1f} s, but the last progress "
            f"(heartbeat or sampler pulse) came {gap:.1f} s before the kill (stall window "
            f"{window:.1f} s): not progressing"])
    return _slow_verdict(evidence, gap, window)


def _still_starting(evidence: Evidence, window: float) -> Verdict:
    """SLOW: the limit came before the first heartbeat, sooner than a stall could be
    declared (no progress for the stall window): the process was still starting (Python,
    its imports), which says nothing of a stall."""
    wall = evidence.outcome.wall_s
    reasons = [f"{words(evidence).limit} ran out after {wall:.1f} s, before the first "
               f"heartbeat: the process was still starting (Python and its imports), and "
               f"no progress for {window:.1f} s (the stall window) is what a stall takes",
               "fraction done unknown: it had not started its work",
               f"give it a limit longer than its start-up (at least {window:.0f} s) to judge "
               f"it"]
    facts = {**_position(evidence), "since_last_event_s": None, "still_starting": True,
             "slow_by": None}
    _add_load(evidence, facts, reasons)
    return Verdict("SLOW", reasons, facts)


def _asked_steps_finished(evidence: Evidence) -> Verdict | None:
    """OK for a trial whose every asked step had finished when the budget kill came (it
    was running extra steps for the step-time median, or writing its result): the run did
    what it was asked. None when a step is missing or the step count is unknown."""
    done, total = evidence.event_counts.get("step", 0), evidence.total_steps
    if total <= 0 or done < total or words(evidence).users_own:
        return None
    facts = {"steps_done": total, "wall_s": evidence.outcome.wall_s, "budget_kill": True}
    return Verdict("OK", [f"the child finished all {total} steps; the budget ran out after "
                          f"{evidence.outcome.wall_s:.1f} s, while it ran {done - total} "
                          f"extra step(s) for the step-time median or wrote its result"],
                   facts)


def _slow_verdict(evidence: Evidence, gap: float | None, window: float) -> Verdict:
    counts = evidence.event_counts
    outcome = evidence.outcome
    started = outcome.ended_at - outcome.wall_s if outcome.ended_at is not None else None
    p = progress(evidence.events, evidence.expected_events_per_step, evidence.total_steps,
                 module_events_done=counts.get("module"), started_t=started,
                 ended_t=outcome.ended_at)
    facts = {**_position(evidence), "rate": p.rate, "rate_window_s": p.window_s,
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
        reasons.append(f"{p.rate:.1f} module events/s over the last {p.window_s:.1f} s")
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
    _add_hot_frame(samples, facts, reasons, at_kill=bool(hot_lines))
    _add_profile(evidence, facts, reasons)
    if hot_lines:
        facts.update(hot_frame=hot_lines[0]["where"], hot_share=hot_lines[0]["fraction"],
                     hot_code=hot_lines[0].get("code"), hot_source="profile")
    slowness = _slowness(evidence, measured, steps[-1] if steps else None)
    if slowness is not None:
        facts["slowness"] = slowness
    load = _add_load(evidence, facts, reasons, slowness,
                     counted=facts.get("slow_by") is not None)
    facts["next_step"] = _slow_next_step(facts)
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


def _moving_loop(profile: dict[str, Any] | None) -> dict[str, Any] | None:
    """The most advanced loop of the profile whose current pass has an end and a pace
    (its position can be told), read in forward or backward; None when there is none."""
    for loop in (profile or {}).get("loops") or []:
        if loop.get("end") and loop.get("pass_rate_per_s") and \
                loop.get("phase") in ("forward", "backward"):
            return loop
    return None


def _duration(seconds: float) -> str:
    """"under a second", "40 s", "3 min", "2.5 h"."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _loop_sentence(loop: dict[str, Any]) -> str:
    """"forward of blocks.0 at t = 1,407 of 2,048, 3.7/s: about 3 min to finish this
    loop (model.py:57)"."""
    where = f"{loop['phase']} of {loop['module']}" if loop.get("module") else \
        f"in {loop['phase']}"
    position = f"{loop['variable']} = {int(loop['last']):,}"
    if loop.get("end"):
        position += f" of {int(loop['end']):,}"
    pace = loop.get("pass_rate_per_s") or loop.get("rate_per_s")
    sentence = f"{where} at {position}" + (f", {pace:.1f}/s" if pace else "")
    if loop.get("eta_s") is not None:
        sentence += f": about {_duration(loop['eta_s'])} to finish this loop"
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
        return sentence + (f"; the loop counter: {_loop_sentence(loop)}"
                           if "loop_position" in facts else "")
    if "loop_position" in facts:
        return (f"ETA of the whole run unknown (no finished step to extrapolate from); the "
                f"loop counter: {_loop_sentence(loop)}")
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


def _slow_next_step(facts: dict[str, Any]) -> str:
    """What to do about a SLOW, from what it measured: an ETA only where one is known."""
    if facts.get("slow_by") == "defect":
        return ("Remove the per-token work the evidence names (a Python loop over the "
                "sequence, a host read such as .item() per token): the run is slow by a "
                "defect, not by its size.")
    eta = facts.get("eta_s")
    if eta is not None:
        return (f"The run is progressing: give the job more than the ETA ({_duration(eta)}) "
                f"to finish, or make the hot frame cheaper.")
    return ("The run is progressing, but no ETA could be measured: give the job more time, "
            "or rerun with fewer steps to measure one; the hot frame says where the time "
            "goes.")


def _add_load(evidence: Evidence, facts: dict, reasons: list[str],
              slowness: dict[str, Any] | None = None, counted: bool = False
              ) -> dict[str, Any] | None:
    """The machine's load while the job ran (nsadiag.verdict.load), relative to its usable
    CPUs, into facts and one sentence (whether contention can explain ``slowness``; a
    verdict that rests on a count when ``counted``); None when no load was recorded."""
    found = contention(evidence.load)
    if found is None:
        return None
    facts["load"] = found
    reasons.append(contention_sentence(found, slowness, counted))
    return found


def _add_profile(evidence: Evidence, facts: dict, reasons: list[str]) -> None:
    """The sampled profile's hottest user line and its loop, when the child wrote one."""
    summary = evidence.profile
    if not summary:
        return
    if summary.get("hot_lines"):
        facts["hot_line"] = summary["hot_lines"][0]["where"]
    if summary.get("loops"):
        facts["loop"] = summary["loops"][0]
    reasons.extend(describe_profile(summary))


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


def _step_sentence(step: dict[str, Any]) -> str:
    forward, backward = step.get("forward_s", 0.0), step.get("backward_s", 0.0)
    return (f"step {step.get('step')} took {step['step_s']:.1f} s (forward {forward:.1f} s, "
            f"backward {backward:.1f} s)")


def _fraction_sentence(p: Progress, evidence: Evidence) -> str:
    if p.fraction is None:
        return "fraction done unknown: no step count"
    if p.events_expected is not None:
        return (f"{p.fraction:.0%} done: {p.events_done} of {p.events_expected} module events "
                f"({evidence.expected_events_per_step} per step x {evidence.total_steps} steps)")
    return f"{p.fraction:.0%} done by steps and the position inside the current step"


def _add_hot_frame(samples: Sequence[StackSample], facts: dict, reasons: list[str],
                   at_kill: bool = False) -> None:
    """Put the hot frame of ``samples`` into facts and a sentence into reasons; with
    ``at_kill`` (a sampled profile names the hot frame) the samples only say where the run
    was when it was stopped (facts kill_frame, kill_count)."""
    hot = hot_frame(samples)
    if hot is None:
        return
    frame, count, native_below = hot
    occurrences = sum(len(busy_threads(sample)) for sample in samples)
    native_known = any(sample.native for sample in samples)
    below = ("native frames sit below it" if native_below else
             "no native frames below it" if native_known else "native frames not sampled")
    code = f" `{frame.code}`" if frame.code else ""
    if at_kill:
        facts.update(kill_frame=frame.where(), kill_count=count, hot_function=frame.function,
                     native_below=native_below)
        reasons.append(f"at the kill the stacks were in {frame.where()}{code} in {count} of "
                       f"{occurrences} thread samples; {below}")
        return
    facts.update(hot_frame=frame.where(), hot_function=frame.function, hot_count=count,
                 native_below=native_below)
    reasons.append(f"hot frame {frame.where()}{code} in {count} of {occurrences} thread "
                   f"samples; {below}")


def rule_stall(evidence: Evidence) -> Verdict | None:
    """The runner saw no heartbeat for its stall timeout: classify from CPU time and stacks."""
    outcome = evidence.outcome
    if not (outcome.killed_by_runner and outcome.kill_reason == "stall"):
        return None
    return _stall_verdict(evidence, [])


def _stall_verdict(evidence: Evidence, preface: list[str]) -> Verdict:
    """STALL-COLLECTIVE, STALL-BUSY or DEADLOCK from the stall evidence, in that order:
    a thread stuck in a collective; busy_fraction >= 0.5 busy; < 0.1 with frozen stacks a
    deadlock; in between, changing stacks busy and frozen ones a deadlock. INCONCLUSIVE,
    naming that verdict, when the watcher declared the stall on a contended machine."""
    stall = evidence.stall or StallEvidence(
        since_last_event_s=_gap_before_end(evidence) or 0.0, window_s=0.0, cpu_delta_s=None,
        unavailable=["no stall evidence was recorded"])
    facts = {**_position(evidence), "since_last_event_s": stall.since_last_event_s,
             "cpu_delta_s": stall.cpu_delta_s, "window_s": stall.window_s,
             "cpu_fraction": stall.cpu_fraction(), "demand": stall.demand(),
             "samples": len(stall.samples),
             "stacks_changed": stacks_change(stall.samples) if len(stall.samples) >= 2 else None,
             "unavailable": list(stall.unavailable)}
    reasons = [*preface, _cpu_sentence(stall), _position_sentence(facts)]
    _add_profile(evidence, facts, reasons)
    _add_load(evidence, facts, reasons)
    verdict = _stall_collective(stall, facts, reasons) or _stall_by_cpu(stall, facts, reasons)
    _add_others(evidence, verdict)
    _add_thread_exceptions(evidence, verdict)
    if stall.stretched:
        return _contended(stall, verdict)
    return verdict


def _add_thread_exceptions(evidence: Evidence, verdict: Verdict) -> None:
    """Quote the exceptions that ended other threads of the process (the cause of many a
    wait: the thread that would have fed it is gone), second among the reasons."""
    died = evidence.thread_exceptions
    if not died:
        return
    last = last_progress_t(evidence)
    sentences = []
    for record in died[-3:]:
        where = f" at {record['where']}" if record.get("where") else ""
        when = ""
        if last is not None and record.get("t") is not None:
            delta = last - float(record["t"])
            when = f", {abs(delta):.1f} s {'before' if delta >= 0 else 'after'} the last progress"
        sentences.append(f"thread {record.get('thread') or '?'} died of {record.get('type')}: "
                         f"{record.get('message')}{where}{when}")
    verdict.facts["thread_exceptions"] = [
        {key: record.get(key) for key in ("thread", "type", "message", "where", "t")}
        for record in died]
    verdict.reasons.insert(1, f"an exception ended another thread: {'; '.join(sentences)} "
                              f"(a thread that waits for its work waits forever)")


def _add_others(evidence: Evidence, verdict: Verdict) -> None:
    """Every other process of the job sampled at the stall, each by what it is and where
    it waits or works (facts "others"), and, when the watched process waits outside its own
    code while other processes sit in theirs (a DataLoader worker inside the dataset), the
    one that holds it up, second among the reasons (facts "held_by")."""
    places = []
    for other in evidence.others:
        samples = (other.get("stall") or {}).get("samples") or []
        place = describe_place(StackSample.from_dict(samples[-1])) if samples else None
        places.append({"pid": other.get("pid"), "role": other.get("role"), "place": place})
    if not places:
        return
    verdict.facts["others"] = places
    own = evidence.stall.samples[-1] if evidence.stall and evidence.stall.samples else None
    mine = describe_place(own) if own is not None else None
    if verdict.name not in ("DEADLOCK", "STALL-BUSY") or mine is None or \
            mine["state"] != "waits" or _own_frame(mine["where"], own):
        return
    holders = [p for p in places if p["place"] and p["place"].get("own")]
    if not holders:
        return
    first = holders[0]
    same = [p for p in holders[1:] if p["place"]["where"] == first["place"]["where"]]
    also = (f" ({', '.join(str(p['role']) for p in same)}: the same)" if same else "")
    verdict.facts["held_by"] = {"pid": first["pid"], "role": first["role"],
                                **first["place"]}
    verdict.reasons.insert(1, f"the training process {place_sentence(mine)}; it waits for "
                              f"{first['role']} (pid {first['pid']}), which "
                              f"{place_sentence(first['place'])}{also}")


def _own_frame(where: str, sample: StackSample) -> bool:
    """Whether the frame named ``where`` in ``sample`` is of the user's own code."""
    return any(own_code(frame) and frame.where() == where
               for thread in sample.threads for frame in thread.frames)


def _contended(stall: StallEvidence, verdict: Verdict) -> Verdict:
    """INCONCLUSIVE: the stall was declared only after STRETCH windows of wall time because
    the machine gave the job less CPU than the stall timeout in all that time."""
    opportunity = stall.opportunity_s
    facts = {**verdict.facts, "would_be": verdict.name, "contended": True}
    given = f"{opportunity:.1f} s" if opportunity is not None else "an unknown time"
    reasons = [*verdict.reasons,
               f"the machine was contended: in {stall.since_last_event_s:.1f} s without "
               f"progress the job had {given} of CPU opportunity, less than the stall window; "
               f"the stacks alone would read as {verdict.name}, which a quieter machine must "
               f"confirm"]
    return Verdict("INCONCLUSIVE", reasons, facts)


def _cpu_sentence(stall: StallEvidence) -> str:
    fraction = stall.cpu_fraction()
    quiet = f"no progress for {stall.since_last_event_s:.1f} s"
    if fraction is None:
        return f"{quiet}; process CPU time unavailable"
    sentence = (f"{quiet} while the process used {stall.cpu_delta_s:.1f} s of CPU in "
                f"{stall.window_s:.1f} s ({fraction:.0%})")
    demand = stall.demand()
    if demand is not None:
        sentence += (f"; its main thread wanted the CPU {demand:.0%} of that time "
                     f"({stall.runq_delta_s:.1f} s of it waiting for a core)")
    return sentence


def working_demand(stall: StallEvidence) -> float | None:
    """The main thread's demand (StallEvidence.demand) when it also received at least
    IDLE_CPU_FRACTION of the CPU time it waited for and used; None otherwise. A thread
    that computes gets a share however loaded the machine (a spin beside five burners on
    two cores got 28 %); one that was only woken, and then waited a second for a core on a
    busy machine, received almost none of it: that wait says nothing about work."""
    demand = stall.demand()
    if demand is None or stall.main_cpu_delta_s is None or stall.runq_delta_s is None:
        return None
    wanted = stall.main_cpu_delta_s + stall.runq_delta_s
    return demand if wanted > 0 and stall.main_cpu_delta_s >= IDLE_CPU_FRACTION * wanted \
        else None


def busy_fraction(stall: StallEvidence) -> float | None:
    """How busy the stalled process was, relative to the CPU it could get: the larger of
    its CPU share and its main thread's working demand (on-CPU plus run-queue time), so a
    spin on a loaded machine that got 28 % of a core still reads as busy; None when neither
    is known."""
    readings = [x for x in (stall.cpu_fraction(), working_demand(stall)) if x is not None]
    return max(readings) if readings else None


def _stall_collective(stall: StallEvidence, facts: dict, reasons: list[str]) -> Verdict | None:
    """STALL-COLLECTIVE when a thread waits in a collective (frames.find_collective)."""
    found = find_collective(stall.samples)
    if found is None:
        return None
    thread, frame, count = found
    facts.update(collective=frame.function, collective_frame=frame.where(),
                 thread=_thread_label(thread), confidence="high")
    reasons.append(f"{_thread_label(thread)} waits in the collective {frame.where()} in "
                   f"{count} of {len(stall.samples)} stack samples")
    return Verdict("STALL-COLLECTIVE", reasons, facts)


def _no_stacks(stall: StallEvidence) -> str:
    return "stacks unavailable: " + ("; ".join(stall.unavailable) or "no sample was taken")


def _stall_by_cpu(stall: StallEvidence, facts: dict, reasons: list[str]) -> Verdict:
    """Busy, idle or in between by busy_fraction; unknown CPU falls back on the stacks."""
    fraction = busy_fraction(stall)
    if fraction is None:
        return _stall_cpu_unknown(stall, facts, reasons)
    if fraction >= BUSY_CPU_FRACTION:
        if not stall.samples:
            reasons.append(_no_stacks(stall) + "; no hot frame")
        return _busy(stall.samples, facts, reasons, "high")
    if fraction < IDLE_CPU_FRACTION:
        return _idle(stall, facts, reasons)
    return _partly_busy(stall, facts, reasons)


def _busy(samples: Sequence[StackSample], facts: dict, reasons: list[str],
          confidence: str) -> Verdict:
    """STALL-BUSY with the hot frame and what the stacks show."""
    facts["confidence"] = confidence
    _add_hot_frame(samples, facts, reasons)
    if samples:
        facts["stacks_class"] = classify(samples)
    return Verdict("STALL-BUSY", reasons, facts)


def _deadlock(samples: Sequence[StackSample], facts: dict, reasons: list[str],
              confidence: str) -> Verdict:
    """DEADLOCK naming the wait frame of the last sample, or its hot frame when no known
    wait is in it."""
    facts["confidence"] = confidence
    waiting = _waiting_thread(samples[-1]) if samples else None
    if waiting is not None:
        thread, frame = waiting
        code = f" `{frame.code}`" if frame.code else ""
        facts.update(wait_frame=frame.where(), wait_function=frame.function,
                     thread=_thread_label(thread))
        caller = "" if own_code(frame) else _caller_of(thread, facts)
        reasons.append(f"{_thread_label(thread)} is blocked in {frame.where()}{code}{caller}")
        return Verdict("DEADLOCK", reasons, facts)
    hot = hot_frame(samples)
    if hot is not None:
        facts.update(hot_frame=hot[0].where(), hot_function=hot[0].function)
        reasons.append(f"stopped in {hot[0].where()}, which is not a known lock or wait")
    return Verdict("DEADLOCK", reasons, facts)


def _caller_of(thread: ThreadStack, facts: dict) -> str:
    """", called from main (train.py:47) `batch = batches.get()`": the innermost frame of
    the user's own code under a wait in a library (facts "wait_caller"); "" without one."""
    own = next((frame for frame in thread.frames if own_code(frame)), None)
    if own is None:
        return ""
    facts["wait_caller"] = own.where()
    code = f" `{own.code}`" if own.code else ""
    return f", called from {own.where()}{code}"


def _idle(stall: StallEvidence, facts: dict, reasons: list[str]) -> Verdict:
    """CPU idle: a deadlock. High confidence only with several identical samples that
    show a wait; lower when the stacks are missing, single, changing or show no wait."""
    samples = stall.samples
    if not samples:
        reasons.append("lower confidence: " + _no_stacks(stall))
        return _deadlock(samples, facts, reasons, "low")
    frozen = not stacks_change(samples)
    waiting = _waiting_thread(samples[-1]) is not None
    if len(samples) < 2:
        reasons.append("lower confidence: one stack sample only, so frozen stacks are not shown")
        return _deadlock(samples, facts, reasons, "medium")
    if not frozen:
        reasons.append("lower confidence: the stacks change between samples although the CPU "
                       "is idle (a polling wait that never ends)")
        return _deadlock(samples, facts, reasons, "low")
    reasons.append(f"stacks identical across all {len(samples)} samples")
    return _deadlock(samples, facts, reasons, "high" if waiting else "medium")


def _partly_busy(stall: StallEvidence, facts: dict, reasons: list[str]) -> Verdict:
    """CPU between idle and busy: changing stacks mean work, frozen stacks a deadlock."""
    samples = stall.samples
    if len(samples) >= 2 and stacks_change(samples):
        reasons.append("CPU partly busy and the stacks change between samples: working")
        return _busy(samples, facts, reasons, "medium")
    demand = working_demand(stall)
    if len(samples) >= 2 and demand is not None and demand >= BUSY_AT_ONE_LINE:
        reasons.append(f"CPU partly busy and the stacks are identical across samples, but the "
                       f"main thread wanted the CPU {demand:.0%} of the time: busy at one "
                       f"line (a native call or a loop over that line), not frozen")
        return _busy(samples, facts, reasons, "medium")
    if len(samples) >= 2:
        reasons.append("CPU partly busy but the stacks are identical across samples: frozen")
        return _deadlock(samples, facts, reasons, "medium")
    if samples and _waiting_thread(samples[-1]) is not None:
        reasons.append("CPU partly busy; one stack sample only, blocked in a wait")
        return _deadlock(samples, facts, reasons, "low")
    reasons.append("CPU partly busy and fewer than two stack samples to compare: taken as "
                   "working, low confidence" + (f" ({_no_stacks(stall)})" if not samples else ""))
    return _busy(samples, facts, reasons, "low")


def _stall_cpu_unknown(stall: StallEvidence, facts: dict, reasons: list[str]) -> Verdict:
    """No CPU reading: the stacks alone decide (see frames.classify); with no stacks
    either, busy and idle cannot be told apart and DEADLOCK is stated with low confidence."""
    samples = stall.samples
    if not samples:
        reasons.append("low confidence: neither CPU time nor stacks are available, so busy "
                       "cannot be told from idle; " + _no_stacks(stall))
        return _deadlock(samples, facts, reasons, "low")
    kind = classify(samples)
    facts["stacks_class"] = kind
    reasons.append(f"medium confidence: CPU time unavailable; the stacks alone read as {kind}")
    if kind == "waiting":
        return _deadlock(samples, facts, reasons, "medium")
    return _busy(samples, facts, reasons, "medium")


def rule_exit_code(evidence: Evidence) -> Verdict:
    """ERROR for anything else: an exit without an exception or a signal."""
    outcome, result = evidence.outcome, evidence.result
    said = words(evidence)
    facts = {**_position(evidence), "exit_code": outcome.exit_code,
             "result_status": (result or {}).get("status")}
    if said.users_own:
        reasons = [f"{said.who} exited with code {outcome.exit_code} {said.no_exception}"]
    elif result is None:
        reasons = [f"the child exited with code {outcome.exit_code} without writing a result"]
    else:
        reasons = [f"{words(evidence).who} exited with code {outcome.exit_code} and result status "
                   f"{result.get('status')!r} without an exception"]
    code = outcome.exit_code
    if code is not None and code > 128 and code - 128 in signals.valid_signals():
        reasons.append(f"{code} = 128 + {_signal_name(code - 128, None)}: {said.between} "
                       f"may report a signal this way")
    if outcome.killed_by_runner:
        reasons.append(f"{said.runner} killed it (reason {outcome.kill_reason!r})")
    reasons.append(_position_sentence(facts))
    return Verdict("ERROR", reasons, facts)


RULES: tuple[Callable[[Evidence], Verdict | None], ...] = (
    rule_ok, rule_exception, rule_signal, rule_budget, rule_stall)


def decide(evidence: Evidence) -> Verdict:
    """The verdict of the first rule that applies; ``rule_exit_code`` when none does."""
    for rule in RULES:
        verdict = rule(evidence)
        if verdict is not None:
            return verdict
    return rule_exit_code(evidence)
