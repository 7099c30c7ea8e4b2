"""The finding of `nsadiag attach PID`: what a live process (or every rank of a job) read as
over the window, from attach.json (nsadiag.commands.attach).

The process blamed is the odd rank out (the one not waiting where the others wait), else
the first one that is not progressing; its stack samples name the line (a spin's loop, the
lock it waits on, the collective it issued: nsadiag.finding.culprit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsadiag.evidence import StallEvidence
from nsadiag.finding import Culprit, Finding, Item, fail, kind_of, ok, warn
from nsadiag.finding.culprit import busy_culprit, wait_culprit
from nsadiag.finding.numbers import share
from nsadiag.finding.source import Sources, carried_sources
from nsadiag.finding.trial import next_action, stall_proof, status_of
from nsadiag.ranknames import RankNames
from nsadiag.runmeta import RunMeta
from nsadiag.stored import NUMBER, optional
from nsadiag.verdict.names import Verdict

NOTHING_STUCK = ("Nothing stuck was seen in the window: if the run still seems to hang, attach "
                 "for longer, or run it under `nsadiag run` for a heartbeat and a deadline.")


def _verdict_of(data: dict[str, Any]) -> Verdict:
    return Verdict.from_dict(data)


@dataclass(frozen=True)
class AttachedProcess:
    """One process of attach.json (nsadiag.harness.window.WindowObservation.to_dict): its
    pid, rank (None: not a rank), command line, state in words, verdict (None: not
    judged), CPU fraction over the window, the user's and the collective's frame it stood
    in, the heartbeat events it wrote in the window (None: no nsadiag heartbeat) and its
    stall evidence."""

    pid: int
    rank: int | None
    cmdline: str
    state: str
    verdict: Verdict | None
    cpu_fraction: float | None
    user_frame: str | None
    collective_frame: str | None
    heartbeat_events: int | None
    stall: StallEvidence | None
    names: RankNames | None = None
    """Host, local and node rank as its environment gave them (``attach --ranks``), its
    global rank the one it was attached as; None where not read."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttachedProcess:
        verdict, stall = optional(data, "verdict", dict), optional(data, "stall", dict)
        names, rank = optional(data, "names", dict), optional(data, "rank", int)
        return cls(pid=int(data["pid"]), rank=rank,
                   names=RankNames.from_dict({**names, "rank": rank}) if names else None,
                   cmdline=optional(data, "cmdline", str) or "", state=str(data["state"]),
                   verdict=_verdict_of(verdict) if verdict else None,
                   cpu_fraction=optional(data, "cpu_fraction", NUMBER),
                   user_frame=optional(data, "user_frame", str),
                   collective_frame=optional(data, "collective_frame", str),
                   heartbeat_events=optional(data, "heartbeat_events", int),
                   stall=StallEvidence.from_dict(stall) if stall else None)

    def label(self) -> str:
        """"rank 3 on host2 (local rank 1, node 1) (pid 4242)" where its names were read,
        "rank 1 (pid 4242)" where not, "pid 4242" for a process that is not a rank."""
        if self.rank is None:
            return f"pid {self.pid}"
        rank = self.names.label() if self.names is not None else f"rank {self.rank}"
        return f"{rank} (pid {self.pid})"


@dataclass(frozen=True)
class AttachRecord:
    """attach.json (nsadiag.commands.attach): the verdict over every process, the state in
    words, each process, and the source of the lines it names (nsadiag.sourcelines)."""

    verdict: Verdict
    state: str
    processes: tuple[AttachedProcess, ...]
    source: dict[str, Any] | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttachRecord:
        return cls(verdict=_verdict_of(data["verdict"]), state=str(data["state"]),
                   processes=tuple(AttachedProcess.from_dict(p)
                                   for p in optional(data, "processes", list) or ()),
                   source=optional(data, "source", dict))


def blamed(stored: AttachRecord) -> AttachedProcess | None:
    """The process the verdict is about: an odd rank, else the first not progressing."""
    odd = set(stored.verdict.facts.ranks.odd_ranks or [])
    for process in stored.processes:
        if process.rank in odd:
            return process
    return next((p for p in stored.processes
                 if p.verdict is not None and p.verdict.name != "OK"), None)


def _culprit(process: AttachedProcess | None, sources: Sources) -> Culprit | None:
    if process is None:
        return None
    samples = process.stall.samples if process.stall is not None else []
    name = process.verdict.name if process.verdict is not None else None
    if name == "DEADLOCK":
        return wait_culprit(samples, sources)
    if name in ("STALL-BUSY", "STALL-COLLECTIVE") or process.collective_frame:
        native = (process.stall.stacks_class if process.stall else None) != "busy-python"
        return busy_culprit(samples, sources, native=native)
    return None


def attach_finding(stored: AttachRecord, meta: RunMeta) -> Finding:
    """The finding of one attach (``stored`` is attach.json, ``meta`` run.json)."""
    verdict = stored.verdict
    name, facts = verdict.name, verdict.facts
    process = blamed(stored)
    culprit = _culprit(process, carried_sources(stored.source))
    own_facts = (process.verdict.facts if process and process.verdict else None) or facts
    kind = kind_of(name, facts.slow.slow_by)
    target = f"the ranks under pid {meta.pid}" if meta.ranks else f"pid {meta.pid}"
    subject = f"{target}, watched {meta.duration_s:g} s"
    proof = stall_proof(own_facts) if name in ("STALL-BUSY", "DEADLOCK") else \
        (verdict.reasons or [None])[0]
    action = next_action(name, own_facts, culprit) if name != "OK" else NOTHING_STUCK
    results: list[Item] = []
    for p in stored.processes:
        state = p.verdict.name if p.verdict is not None else "?"
        cpu = f", {share(p.cpu_fraction)} CPU" if p.cpu_fraction is not None else ""
        text = f"{p.label()}: {p.state}{cpu}" + (f", in {p.collective_frame}"
                                                   if p.collective_frame else "")
        results.append(ok(text) if state == "OK" else fail(text) if state != "INCONCLUSIVE"
                       else warn(text))
    where = f" at {culprit.where()}" if culprit and culprit.line else ""
    implicated = [fail(f"{culprit.where()}: {culprit.why}.")] if culprit else []
    summary = [f"Watched {target} for {meta.duration_s:g} s without stopping it: "
               f"{stored.state}."] + [r[:1].upper() + r[1:] + "." for r in
                                      verdict.reasons[:2]]
    return Finding(command="attach", verdict=name, kind=kind,
                   status=status_of(name, facts.slow.slow_by),
                   headline=f"{name} ({kind}){where}", subject=subject, next_action=action,
                   culprit=culprit, proof=proof, summary=summary, results=results,
                   implicated=implicated)
