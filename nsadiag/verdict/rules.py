"""The verdict rules: evidence -> verdict, with the measured facts and the reasons that decided it.

Pure functions: no I/O, no clock. ``decide`` tries the rules below in order and the first
that applies names the verdict; every reason is a sentence tied to a measured fact.

1. ``rule_ok``         result status ok and exit 0                          -> OK
2. ``rule_exception``  an exception in the result                           -> OOM | ERROR
3. ``rule_signal``     a signal the runner did not send (or the OOM killer) -> OOM | CRASH
4. ``rule_budget``     the runner's time budget ran out                      -> SLOW, with
                       its rate, ETA and cause (nsadiag.verdict.slow), or a stall verdict
                       when progress had stopped before the kill
5. ``rule_stall``      the runner saw no progress for the stall timeout     -> STALL-COLLECTIVE
                       | STALL-BUSY | DEADLOCK, from CPU demand and stacks
                       (nsadiag.verdict.stall); INCONCLUSIVE when a contended machine
                       explains it
6. ``rule_exit_code``  anything else                                        -> ERROR

Progress is what nsadiag.verdict.progress.is_progress says: a heartbeat event (a block
entered or left, a step, a collective) or a pulse of the progress sampler that saw progress
(a loop iterating inside one module, autograd nodes running in backward). A timer firing is
never a verdict by itself: a run still progressing is SLOW, and a run that stopped is
classified by what its process was doing. The figures compared against are
nsadiag.verdict.thresholds'.

The reasons speak of "the child" for a job nsadiag started (a trial, a check) and of "the
command" for a user's own command under ``nsadiag run`` (its evidence's spec names the
command), whose time limit is its deadline rather than a budget.
"""

from __future__ import annotations

import re
import signal as signals
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nsadiag.evidence import Evidence, StackSample, StallEvidence
from nsadiag.fmt import gib, mib
from nsadiag.probes.frames import describe_place, own_code, place_sentence
from nsadiag.verdict.chain import add_chain, wait_chain
from nsadiag.verdict.facts import (
    add_load,
    position_facts,
    position_sentence,
    words,
)
from nsadiag.verdict.known import explain_exception, is_oom_exception, project_frame
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.progress import is_progress
from nsadiag.verdict.slow import slow_verdict
from nsadiag.verdict.stall import classify_stall, contended
from nsadiag.verdict.thresholds import DEFAULT_STALL_WINDOW_S, MIN_GROWTH_STEPS
from nsadiag.verdict.waits.model import WaitChain

# ---- helpers for reasons ------------------------------------------------------------------


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


ORIGINAL_TRACEBACK = "Original Traceback (most recent call last):"
"""How torch re-raises an exception from another process or thread (a DataLoader worker's,
a pin-memory thread's): "Caught KeyError in DataLoader worker process 1." then this line,
the original traceback, and the original exception's own line last."""


def said_message(message: str) -> str:
    """The line that says what went wrong: the message's first line, or, for an exception
    torch re-raised from a DataLoader worker, the original exception's message with where it
    was raised ('"record 37 has no label" (raised in DataLoader worker process 1)')."""
    first = message.splitlines()[0] if message else ""
    if ORIGINAL_TRACEBACK not in message:
        return first
    original = message.split(ORIGINAL_TRACEBACK, 1)[1].splitlines()
    last = next((line for line in reversed(original) if line.strip() and
                 not line.startswith(" ")), None)
    if last is None:
        return first
    text = last.partition(":")[2].strip() or last.strip()
    caught = re.match(r"Caught \w+ in (.+?)\.?$", first)
    return f"{text} (raised in {caught[1]})" if caught else text


KILLED_CHILD = re.compile(r"killed by signal|exited unexpectedly", re.IGNORECASE)
"""An exception that reports a child's death (a DataLoader's: "DataLoader worker (pid 12)
is killed by signal: Killed.", "... exited unexpectedly")."""


def rule_exception(evidence: Evidence) -> Verdict | None:
    """OOM when the recorded exception names memory exhaustion (torch.OutOfMemoryError,
    MemoryError, "CUDA out of memory", "DefaultCPUAllocator: can't allocate memory",
    "not enough memory"), or reports a killed child while the kernel's OOM killer acted in
    the job's memory cgroup; ERROR with type, message and the innermost project frame for
    any other exception."""
    exception = (evidence.result or {}).get("exception")
    if not exception:
        return None
    kind = str(exception.get("type", "Exception"))
    message = str(exception.get("message", "")).strip()
    first_line = said_message(message)
    where = project_frame(str(exception.get("traceback", "")))
    facts = {**position_facts(evidence), "exception_type": kind, "message": first_line,
             "where": where, "peak_rss": (evidence.result or {}).get("peak_rss")}
    who = words(evidence).who
    reasons = [f"{who} raised {kind}: {first_line}"]
    if where:
        reasons.append(f"innermost project frame: {where}")
    explanation = explain_exception(kind, message)
    if explanation:
        facts.update(cause=explanation["cause"], known_error=explanation["known"])
        reasons.append(f"cause: {explanation['cause']}")
    child_killed = evidence.outcome.oom_killer and bool(KILLED_CHILD.search(message))
    if not is_oom_exception(exception, bool((evidence.result or {}).get("oom"))) and \
            not child_killed:
        return Verdict("ERROR", reasons, facts)
    if child_killed:
        cap = evidence.outcome.memory_cap_bytes
        limit = f" (its limit: {gib(cap)})" if cap else ""
        reasons.append(f"the kernel's OOM killer killed a process in the job's memory "
                       f"cgroup{limit} while it ran: the child the exception names")
    if facts["peak_rss"]:
        reasons.append(f"peak RSS of {who} was {gib(facts['peak_rss'])}")
    peak_cuda = (evidence.result or {}).get("peak_cuda")
    if peak_cuda:
        facts["peak_cuda"] = peak_cuda
        reasons.append(f"peak CUDA memory allocated was {gib(peak_cuda)}")
    if evidence.outcome.memory_cap_bytes and not child_killed:
        reasons.append(f"the runner capped memory at {gib(evidence.outcome.memory_cap_bytes)}")
    _add_memory_growth(evidence, facts, reasons)
    return Verdict("OOM", reasons, facts)


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
            reasons.append(f"{label} grew {mib(growth['per_step'])} per step over the last "
                           f"{growth['steps']} steps (from {mib(growth['first'])} to "
                           f"{mib(growth['last'])} at the step ends)")
        ledgers = (evidence.profile or {}).get("memory") or {}
        holder, held_as = (ledgers.get(ledger) or {}).get("holder"), label
        heap = (ledgers.get("heap") or {}).get("holder") if ledger == "rss" else None
        if heap:  # the heap in use names where kept memory was allocated, RSS where pages
            holder, held_as = heap, "heap memory in use"  # were needed (probes/heap.py)
        if holder:
            code = f" `{holder['code']}`" if holder.get("code") else ""
            facts[f"{ledger}_holder"] = holder["where"]
            reasons.append(f"the frame that keeps allocating across steps: {holder['where']}"
                           f"{code} holds {mib(holder['held'])} of {held_as}, taken in "
                           f"{holder['steps']} steps and not given back")


def rule_signal(evidence: Evidence) -> Verdict | None:
    """A signal the runner did not send: OOM for the kernel OOM killer or for SIGKILL under
    a memory cap; CRASH naming the signal otherwise (SIGSEGV, SIGABRT, SIGBUS, ...)."""
    outcome = evidence.outcome
    if outcome.killed_by_runner or (outcome.signal is None and not outcome.oom_killer):
        return None
    name = _signal_name(outcome.signal, outcome.signal_name) if outcome.signal else None
    facts = {**position_facts(evidence), "signal": outcome.signal, "signal_name": name,
             "memory_cap_bytes": outcome.memory_cap_bytes, "wall_s": outcome.wall_s}
    where = position_sentence(facts)
    said = words(evidence)
    if outcome.oom_killer:
        reasons = [f"the kernel OOM killer killed {said.who} ({name or 'no signal'} "
                   f"recorded) after {outcome.wall_s:.1f} s", where]
        _add_memory_growth(evidence, facts, reasons)
        return Verdict("OOM", reasons, facts)
    if name == "SIGKILL" and outcome.memory_cap_bytes:
        rss = facts.get("last_rss")
        reasons = [f"{said.who} died of SIGKILL, not sent by {said.runner}, under a memory cap "
                   f"of {gib(outcome.memory_cap_bytes)}: the kernel kills at the cap", where]
        if rss:
            reasons.append(f"RSS at the last heartbeat was {gib(rss)}")
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
    """Time of the last progress (nsadiag.verdict.progress.is_progress) among the recorded
    heartbeat events and sampler pulses; None when neither recorded any."""
    times = [event["t"] for event in (*evidence.events, *evidence.pulses)
             if "t" in event and is_progress(event)]
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
    return slow_verdict(evidence, gap, window)


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
    facts = {**position_facts(evidence), "since_last_event_s": None, "still_starting": True,
             "slow_by": None}
    add_load(evidence.load, facts, reasons)
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


def rule_stall(evidence: Evidence) -> Verdict | None:
    """The runner saw no heartbeat for its stall timeout: classify from CPU time and stacks."""
    outcome = evidence.outcome
    if not (outcome.killed_by_runner and outcome.kill_reason == "stall"):
        return None
    return _stall_verdict(evidence, [])


def _stall_verdict(evidence: Evidence, preface: list[str]) -> Verdict:
    """STALL-COLLECTIVE, STALL-BUSY or DEADLOCK from the stall evidence
    (nsadiag.verdict.stall.classify_stall), with what the other processes and threads of
    the job show; INCONCLUSIVE, naming that verdict, when the watcher declared the stall on
    a contended machine."""
    stall = evidence.stall or StallEvidence(
        since_last_event_s=_gap_before_end(evidence) or 0.0, window_s=0.0, cpu_delta_s=None,
        unavailable=["no stall evidence was recorded"])
    verdict = classify_stall(stall, preface, position_facts(evidence), evidence.profile,
                             evidence.load)
    chain = wait_chain(evidence)
    _add_others(evidence, verdict, chain)
    _add_thread_exceptions(evidence, verdict)
    add_chain(verdict, chain)
    if stall.stretched:
        return contended(stall, verdict)
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
    verdict.facts = verdict.facts.with_facts(thread_exceptions=[
        {key: record.get(key) for key in ("thread", "type", "message", "where", "t")}
        for record in died])
    verdict.reasons.insert(1, f"an exception ended another thread: {'; '.join(sentences)} "
                              f"(a thread that waits for its work waits forever)")


def _add_others(evidence: Evidence, verdict: Verdict, chain: WaitChain | None) -> None:
    """Every other process of the job sampled at the stall, each by what it is and where
    it waits or works (facts "others"), and, when the watched process waits outside its own
    code while other processes sit in theirs (a DataLoader worker inside the dataset) and
    its wait ``chain`` (nsadiag.verdict.chain) names nothing better, the one that holds it
    up, second among the reasons (facts "held_by")."""
    places = []
    for other in evidence.others:
        samples = (other.get("stall") or {}).get("samples") or []
        place = describe_place(StackSample.from_dict(samples[-1])) if samples else None
        places.append({"pid": other.get("pid"), "role": other.get("role"), "place": place})
    if not places:
        return
    verdict.facts = verdict.facts.with_facts(others=places)
    own = evidence.stall.samples[-1] if evidence.stall and evidence.stall.samples else None
    mine = describe_place(own) if own is not None else None
    if verdict.name not in ("DEADLOCK", "STALL-BUSY") or mine is None or \
            mine["state"] != "waits" or _own_frame(mine["where"], own) or \
            chain is not None and chain.end != "unknown":
        return
    holders = [p for p in places if p["place"] and p["place"].get("own")]
    if not holders:
        return
    first = holders[0]
    same = [p for p in holders[1:] if p["place"]["where"] == first["place"]["where"]]
    also = (f" ({', '.join(str(p['role']) for p in same)}: the same)" if same else "")
    verdict.facts = verdict.facts.with_facts(held_by={"pid": first["pid"],
                                                      "role": first["role"], **first["place"]})
    verdict.reasons.insert(1, f"the training process {place_sentence(mine)}; it waits for "
                              f"{first['role']} (pid {first['pid']}), which "
                              f"{place_sentence(first['place'])}{also}")


def _own_frame(where: str, sample: StackSample) -> bool:
    """Whether the frame named ``where`` in ``sample`` is of the user's own code."""
    return any(own_code(frame) and frame.where() == where
               for thread in sample.threads for frame in thread.frames)


def rule_exit_code(evidence: Evidence) -> Verdict:
    """ERROR for anything else: an exit without an exception or a signal."""
    outcome, result = evidence.outcome, evidence.result
    said = words(evidence)
    facts = {**position_facts(evidence), "exit_code": outcome.exit_code,
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
    command = evidence.command
    calls = (command.exit_calls or []) if command is not None else []
    if len(calls) == 1:  # the one line of its script that exits with this code
        facts["where"] = f"{calls[0]['file']}:{calls[0]['line']} in <exit>"
        reasons.append(f"its script exits with {code} at {Path(calls[0]['file']).name}:"
                       f"{calls[0]['line']} `{calls[0]['code']}`")
    elif calls:
        reasons.append(f"its script exits with {code} at {len(calls)} lines: " + ", ".join(
            f"{Path(c['file']).name}:{c['line']}" for c in calls))
    if command is not None and command.last_output:
        facts["message"] = command.last_output
        reasons.append(f"the last line it printed: {command.last_output}")
    if outcome.killed_by_runner:
        reasons.append(f"{said.runner} killed it (reason {outcome.kill_reason!r})")
    reasons.append(position_sentence(facts))
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
