"""What a live process reads as over an observation window, and a job's processes together
(pure): the verdicts of ``nsadiag attach``.

A process watched for a window without being stopped (nsadiag.harness.window samples it)
reads as one of:

progressing             its heartbeat recorded progress in the window
                        (nsadiag.verdict.progress.is_progress); or, without one (or when
                        its sampler did not pulse in the window), its Python stacks changed
                        between samples while it used at least IDLE_CPU_FRACTION of a CPU
                        and no thread sat in a collective (verdict OK: nothing stuck was
                        seen);
waiting in a collective a thread sat in a collective in most samples (STALL-COLLECTIVE);
stuck (busy)            frozen stacks and busy CPU (STALL-BUSY, with the hot frame);
stuck (idle)            frozen stacks and idle CPU (DEADLOCK, with the wait frame).

The last three are the stall classification of every watched run
(nsadiag.verdict.stall.classify_stall), the window standing in for the stall timeout.
Without a heartbeat, a loop that never ends but moves between lines reads as progressing:
stacks alone cannot tell it from work. A heartbeat whose sampler pulsed in the window and
saw no progress outranks moving stacks: a spin over a few lines moves them, and more so on
a loaded machine, where a sample more often lands between two lines.

Across the processes of a job (``decide_job``): all progressing is OK; any rank waiting in
a collective makes the job STALL-COLLECTIVE, naming each rank's collective and the frame of
its own code that issued it, and the rank(s) whose stacks no other rank shares when the
others agree (or, when only some wait, the ranks that do not wait: the others wait for
them); otherwise the verdict of the first stuck rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from nsadiag.evidence import StallEvidence
from nsadiag.probes import frames
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.progress import is_progress
from nsadiag.verdict.stall import busy_fraction, classify_stall, contended
from nsadiag.verdict.thresholds import IDLE_CPU_FRACTION

STATES = {"OK": "progressing", "STALL-COLLECTIVE": "waiting in a collective",
          "STALL-BUSY": "stuck (busy)", "DEADLOCK": "stuck (idle)"}
"""What each verdict of a window says of a process, in words."""


def state_of(name: str) -> str:
    """The state a verdict's name says (STATES; the name in lower case for any other)."""
    return STATES.get(name, name.lower())


def judge_window(stall: StallEvidence, events: Sequence[dict[str, Any]] | None,
                 duration_s: float) -> Verdict:
    """What one process reads as over a window of ``duration_s`` seconds (see the module
    docstring): ``stall`` is its evidence over the window (stack samples and CPU time),
    ``events`` the heartbeat events it wrote meanwhile (None: it has no nsadiag
    heartbeat). The verdict's facts carry the state in words ("state")."""
    samples = stall.samples
    moved = [event for event in events or [] if is_progress(event)]
    fraction = busy_fraction(stall)
    cpu = (f"it used {stall.cpu_delta_s:.1f} s of CPU in {stall.window_s:.1f} s "
           f"({stall.cpu_fraction():.0%})" if stall.cpu_fraction() is not None else
           "its CPU time was unreadable")
    if moved:
        return Verdict("OK", [f"progressing: its nsadiag heartbeat recorded {len(moved)} "
                              f"events of progress in the {duration_s:g} s window; {cpu}"],
                       {"state": "progressing", "heartbeat_progress": len(moved)})
    pulsed = any(event.get("kind") == "pulse" for event in events or [])
    changed = not pulsed and len(samples) >= 2 and frames.stacks_change(samples,
                                                                          python_only=True)
    if changed and fraction is not None and fraction >= IDLE_CPU_FRACTION and \
            frames.find_collective(samples) is None:
        return _moving_stacks(stall, events, duration_s, cpu)
    verdict = classify_stall(stall)
    if stall.stretched:
        verdict = contended(stall, verdict)
    if events is not None:
        verdict.reasons.insert(0, f"its nsadiag heartbeat recorded no progress in the "
                                  f"{duration_s:g} s window")
    verdict.facts = verdict.facts.with_facts(state=state_of(verdict.name))
    return verdict


def _moving_stacks(stall: StallEvidence, events: Sequence[dict[str, Any]] | None,
                   duration_s: float, cpu: str) -> Verdict:
    """OK: the Python stacks changed between samples while the process used the CPU."""
    samples = stall.samples
    distinct = len({frames.stack_signature(s) for s in samples})
    reasons = [f"progressing: its Python stacks changed between samples ({distinct} "
               f"different innermost frames in {len(samples)} samples over "
               f"{duration_s:g} s) while {cpu}"]
    if events is None:
        reasons.append("it has no nsadiag heartbeat, so a loop that never ends would "
                       "read the same; run it under `nsadiag run` to tell them apart")
    facts = {"state": "progressing", "distinct_stacks": distinct, "samples": len(samples)}
    hot = frames.hot_frame(samples)
    if hot is not None:
        facts["hot_frame"] = hot[0].where()
        reasons.append(f"hot frame {hot[0].where()} in {hot[1]} thread samples")
    return Verdict("OK", reasons, facts)


class JudgedProcess(Protocol):
    """One process of a job as ``decide_job`` reads it: its verdict over the window, the
    evidence it rests on, and where its stacks stood (nsadiag.harness.window
    .WindowObservation is one)."""

    pid: int
    rank: int | None
    stall: StallEvidence
    verdict: Verdict | None
    user_frame: str | None
    collective_frame: str | None
    signature: str

    @property
    def state(self) -> str: ...


def decide_job(observations: Sequence[JudgedProcess], duration_s: float) -> Verdict:
    """The verdict over the processes of a job (see the module docstring); each has its own
    verdict already (judge_window)."""
    if len(observations) == 1:
        return observations[0].verdict
    rows = [{"rank": o.rank, "pid": o.pid, "state": o.state,
             "cpu_fraction": o.stall.cpu_fraction(), "collective": o.collective_frame,
             "user_frame": o.user_frame} for o in observations]
    if all(o.verdict.name == "OK" for o in observations):
        return Verdict("OK", [f"all {len(observations)} ranks progressing over the "
                              f"{duration_s:g} s window"], {"ranks": rows, "odd_ranks": []})
    waiting = [o for o in observations if o.verdict.name == "STALL-COLLECTIVE"]
    if not waiting:
        stuck = next(o for o in observations if o.verdict.name != "OK")
        return Verdict(stuck.verdict.name,
                       [f"rank {stuck.rank}: {r}" for r in stuck.verdict.reasons],
                       {**stuck.verdict.facts.to_dict(), "rank": stuck.rank, "ranks": rows})
    if len(waiting) < len(observations):
        odd = [o for o in observations if o not in waiting]
    else:
        odd = frames.odd_ones_out(observations, lambda o: o.signature)
    sentences = [_rank_sentence(o) for o in sorted(observations,
                                                   key=lambda o: (o not in odd, o.rank))]
    reasons = ["; ".join(sentences)]
    names = ", ".join(str(o.rank) for o in odd)
    if odd and len(waiting) < len(observations):
        reasons.append(f"rank(s) {names} do not wait in a collective while the others do: "
                       f"the others wait for them")
    elif odd:
        reasons.append(f"rank(s) {names} wait somewhere no other rank does")
    else:
        reasons.append("the ranks wait in different collectives; which one left the common "
                       "path cannot be told from stacks alone (run the job under `nsadiag "
                       "run` to count each rank's collectives)")
    return Verdict("STALL-COLLECTIVE", reasons,
                   {"ranks": rows, "odd_ranks": sorted(o.rank for o in odd),
                    "confidence": "high" if odd else "medium"})


def _rank_sentence(o: JudgedProcess) -> str:
    where = f", issued from {o.user_frame}" if o.user_frame else ""
    if o.collective_frame:
        return f"rank {o.rank} waits in {o.collective_frame}{where}"
    return f"rank {o.rank} is {o.state}" + (f" at {o.user_frame}" if o.user_frame else "")
