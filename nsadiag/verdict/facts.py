"""The facts and sentences the verdict rules share (pure): whose process it is, where its
heartbeat stood, its hot frame, its sampled profile and the machine's load.

Each ``add_*`` puts its facts into a verdict's ``facts`` and its sentence(s) into its
``reasons``; nothing is added for what was not recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from nsadiag.evidence import Evidence, StackSample
from nsadiag.probes.frames import busy_threads, hot_frame
from nsadiag.probes.profile import describe as describe_profile
from nsadiag.verdict.load import contention, contention_sentence
from nsadiag.verdict.progress import module_events


@dataclass(frozen=True)
class Words:
    """How reasons name the watched process and its limits."""

    who: str
    limit: str  # the wall-clock limit that ended a progressing run
    no_exception: str  # how a failure without a recorded exception is described
    runner: str  # who stops the process
    between: str  # what may sit between nsadiag and the Python process
    users_own: bool  # the user's own code and limits (nsadiag run, watch(), attach)


CHILD = Words("the child", "the budget", "without writing an exception", "the runner",
              "a shell or launcher between the runner and the child", False)
COMMAND = Words("the command", "the deadline", "without a Python traceback on stderr",
                "nsadiag", "the shell or launcher that runs the command", True)


def words(evidence: Evidence) -> Words:
    """CHILD for a trial's child; COMMAND for the user's own code (`nsadiag run`'s
    command, a block under watch(), an attached process), naming it by the spec's
    "subject" ("the command", "the watched block", "the process")."""
    spec = evidence.spec
    if "command" not in spec and "subject" not in spec:
        return CHILD
    return replace(COMMAND, who=str(spec.get("subject") or COMMAND.who))


def position_facts(evidence: Evidence) -> dict[str, Any]:
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


def position_sentence(facts: dict[str, Any]) -> str:
    """The sentence of ``position_facts``."""
    if facts.get("last_module") is None:
        return f"no module heartbeat was recorded ({facts['events_total']} events in all)"
    return (f"last heartbeat: {facts['last_module']} {facts['last_edge']} in "
            f"{facts['last_phase']} of step {facts['last_step']} (steps finished: "
            f"{facts['steps_done']})")


def add_hot_frame(samples: Sequence[StackSample], facts: dict, reasons: list[str],
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


def add_profile(profile: dict[str, Any] | None, facts: dict, reasons: list[str]) -> None:
    """The sampled profile's hottest user line and its loop, when the child wrote one
    (``profile`` is nsadiag.probes.profile.summarize's)."""
    if not profile:
        return
    if profile.get("hot_lines"):
        facts["hot_line"] = profile["hot_lines"][0]["where"]
    if profile.get("loops"):
        facts["loop"] = profile["loops"][0]
    reasons.extend(describe_profile(profile))


def add_load(load: dict[str, Any] | None, facts: dict, reasons: list[str],
             slowness: dict[str, Any] | None = None, counted: bool = False
             ) -> dict[str, Any] | None:
    """The machine's load while the job ran (nsadiag.verdict.load), relative to its usable
    CPUs, into facts and one sentence (whether contention can explain ``slowness``; a
    verdict that rests on a count when ``counted``); None when no load was recorded."""
    found = contention(load)
    if found is None:
        return None
    facts["load"] = found
    reasons.append(contention_sentence(found, slowness, counted))
    return found
