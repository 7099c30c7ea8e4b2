"""A stalled process classified from what it was doing (pure): STALL-COLLECTIVE, STALL-BUSY
or DEADLOCK.

``classify_stall(stall, ...)`` reads a StallEvidence: the CPU time the process used over a
window (its share of a core, and its main thread's demand: on-CPU plus run-queue time), its
stack samples spaced over that window, and native samples where they were taken. The window
is the runner's stall timeout for a watched run (nsadiag.verdict.rules.rule_stall) or an
observation window standing in for it (nsadiag.verdict.window, ``nsadiag attach``). In this
order:

1. STALL-COLLECTIVE: a thread sits in a collective (in the last sample and in at least half
   of them: nsadiag.probes.frames.find_collective);
2. STALL-BUSY, with the hot frame: busy_fraction at or above BUSY_CPU_FRACTION;
3. DEADLOCK, with the wait frame: busy_fraction below IDLE_CPU_FRACTION (high confidence
   only for several identical samples that show a wait);
4. in between: STALL-BUSY for changing stacks, or for a main thread that wanted the CPU
   BUSY_AT_ONE_LINE of the time or more at one line; DEADLOCK for frozen stacks;
5. without a CPU reading the stacks alone decide (nsadiag.probes.frames.classify).

``contended(stall, verdict)`` makes such a verdict INCONCLUSIVE when the watcher declared
the stall on a contended machine. The thresholds are nsadiag.verdict.thresholds'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nsadiag.evidence import StackFrame, StackSample, StallEvidence, ThreadStack
from nsadiag.probes.frames import (
    classify,
    find_collective,
    hot_frame,
    native_call,
    own_code,
    stacks_change,
    user_threads,
    wait_frame,
)
from nsadiag.verdict.chain import add_chain, stall_chain
from nsadiag.verdict.compiling import add_compile_stall
from nsadiag.verdict.facts import add_hot_frame, add_load, add_profile, position_sentence
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.thresholds import BUSY_AT_ONE_LINE, BUSY_CPU_FRACTION, IDLE_CPU_FRACTION


def classify_stall(stall: StallEvidence, preface: Sequence[str] = (),
                   position: dict[str, Any] | None = None,
                   profile: dict[str, Any] | None = None,
                   load: dict[str, Any] | None = None) -> Verdict:
    """STALL-COLLECTIVE, STALL-BUSY or DEADLOCK from a stalled process's evidence, in the
    order of the module docstring, with the stall's facts (stall_facts) and the sentences
    that decided it after ``preface`` and the CPU sentence. ``position`` is where its
    heartbeat stood (nsadiag.verdict.facts.position_facts: into the facts and a sentence;
    None for a process whose heartbeat history was not read, an attached one); ``profile``
    and ``load`` its sampled profile and the machine's load figures, when recorded. Never
    INCONCLUSIVE: ``contended`` qualifies it, once the caller added what else it knows."""
    facts = {**(position or {}), **stall_facts(stall)}
    reasons = [*preface, cpu_sentence(stall)]
    if position is not None:
        reasons.append(position_sentence(position))
    add_profile(profile, facts, reasons)
    add_load(load, facts, reasons)
    add_compile_stall(stall.samples, facts, reasons)
    verdict = _stall_collective(stall, facts, reasons) or _stall_by_cpu(stall, facts, reasons)
    add_chain(verdict, stall_chain(stall))  # what it waits on, from its own evidence
    return verdict


def stall_facts(stall: StallEvidence) -> dict[str, Any]:
    """The stall's own figures: how long without progress, the CPU over the window, the
    main thread's demand, how many samples and whether their stacks changed."""
    return {"since_last_event_s": stall.since_last_event_s,
            "cpu_delta_s": stall.cpu_delta_s, "window_s": stall.window_s,
            "cpu_fraction": stall.cpu_fraction(), "demand": stall.demand(),
            "samples": len(stall.samples),
            "stacks_changed": stacks_change(stall.samples) if len(stall.samples) >= 2 else None,
            "unavailable": list(stall.unavailable)}


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


def cpu_sentence(stall: StallEvidence) -> str:
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
    add_hot_frame(samples, facts, reasons)
    if samples:
        facts["stacks_class"] = classify(samples)
        call = native_call(samples) if facts["stacks_class"] == "busy-native" else None
        if call is not None:
            facts["native_call"] = call
            reasons.append(f"every busy sample sat in the native call {call} under "
                           f"{facts.get('hot_frame') or 'the same line'}")
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


def contended(stall: StallEvidence, verdict: Verdict) -> Verdict:
    """INCONCLUSIVE: the stall was declared only after STALL_STRETCH windows of wall time because
    the machine gave the job less CPU than the stall timeout in all that time."""
    opportunity = stall.opportunity_s
    facts = {**verdict.facts.to_dict(), "would_be": verdict.name, "contended": True}
    given = f"{opportunity:.1f} s" if opportunity is not None else "an unknown time"
    reasons = [*verdict.reasons,
               f"the machine was contended: in {stall.since_last_event_s:.1f} s without "
               f"progress the job had {given} of CPU opportunity, less than the stall window; "
               f"the stacks alone would read as {verdict.name}, which a quieter machine must "
               f"confirm"]
    return Verdict("INCONCLUSIVE", reasons, facts)
