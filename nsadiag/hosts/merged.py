"""One verdict over every host's ranks (pure: no I/O, no clock).

``HostsView`` is what one host knows of the others when it decides: how the hosts met
(the store and where it came from, or per-host views and why), each host's last published
state, the shared stall signal, and the hosts that were lost. ``decide_hosts`` decides:

- a host lost (it published nothing for HOSTS_LOST_AFTER_S while this host's ranks lost
  their peers, and no host had decided a stall): CRASH naming that host, when it was last
  heard from and where each of its ranks was then; the same when a stall was decided
  after a host had gone silent (it never captured, and its last publication is more than
  HOSTS_LOST_AFTER_S older than the stall signal): the ranks that wait for its ranks are
  a consequence of its loss;
- a stall decided on some host: the ranks of every host decided together
  (nsadiag.verdict.ranks.decide_ranks), as stopped at that stall; a rank of this host that
  only lost its peers after the stop elsewhere is read as it stood before (that exception
  is a consequence, said so, never this host's own ERROR);
- otherwise the ranks of every host decided together as they ended.

A straggler seen while the job progressed (nsadiag.verdict.straggler, from the step paces
each host published) is added to the verdict's reasons and facts, whatever the verdict.

Each rank is named by host, global, local and node rank; a rank that waits in a
collective is said to wait "in collective #N for rank R on host H" when the ranks that
never issued #N are known.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nsadiag.evidence import Evidence
from nsadiag.hosts.groups import JobGroup, folded
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.ranks import (
    RankEvidence,
    decide_ranks,
    describe_collective,
    position,
    rank_label,
    rank_table,
    waiting_in,
)
from nsadiag.verdict.straggler import StepPace, Straggler, find_straggler
from nsadiag.verdict.thresholds import HOSTS_LOST_AFTER_S


@dataclass
class HostState:
    """What one host published: its name, ``phase`` ("live" while its ranks run,
    "captured" after its capture at a stall, "ended" when its command ended by itself),
    when, its ranks, each rank's latest finished steps ({global rank: paces}: its events
    as published are too few to hold them) and the user frame its sampler saw most
    ({global rank: nsadiag.verdict.straggler.hot_frame})."""

    host: str
    phase: str
    published_at: float
    ranks: list[RankEvidence] = field(default_factory=list)
    paces: dict[int, list[StepPace]] = field(default_factory=dict)
    frames: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "phase": self.phase, "published_at": self.published_at,
                "ranks": [r.to_dict() for r in self.ranks],
                "paces": {str(r): [p.to_list() for p in rows]
                          for r, rows in self.paces.items()},
                "frames": {str(r): frame for r, frame in self.frames.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostState:
        return cls(str(data["host"]), str(data["phase"]), float(data["published_at"]),
                   [RankEvidence.from_dict(r) for r in data.get("ranks") or []],
                   {int(r): [StepPace.from_list(p) for p in rows]
                    for r, rows in (data.get("paces") or {}).items()},
                   {int(r): dict(f) for r, f in (data.get("frames") or {}).items() if f})


@dataclass
class HostsView:
    """One host's view of the job's hosts (see the module docstring). ``mode`` says how
    the hosts met, in words; ``shared`` whether through a store."""

    host: str
    mode: str
    shared: bool
    states: dict[str, HostState] = field(default_factory=dict)
    stall: dict[str, Any] | None = None
    lost: list[str] = field(default_factory=list)
    store_ops: int = 0
    straggler: dict[str, Any] | None = None
    """The latest straggler seen (Straggler.to_dict and ``seen_at``), None if none."""
    groups: list[JobGroup] = field(default_factory=list)
    """The job's ranks folded by where they stood at the stall (nsadiag.hosts.groups)."""
    decider: str | None = None
    """The host that gathered the merged evidence at the stall."""
    replaced: list[str] = field(default_factory=list)
    """Deciders lost at the stall, each replaced by the next in the deciding order."""

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "mode": self.mode, "shared": self.shared,
                "hosts": sorted(self.states), "stall": self.stall, "lost": self.lost,
                "store_ops": self.store_ops, "straggler": self.straggler,
                "decider": self.decider, "replaced": self.replaced,
                "groups": [g.to_dict() for g in self.groups],
                "published_at": {h: s.published_at for h, s in self.states.items()},
                "phase": {h: s.phase for h, s in self.states.items()},
                # each rank's hot frame, so that `nsadiag merge` names a straggler's frame
                "frames": {h: {str(r): f for r, f in s.frames.items()}
                           for h, s in self.states.items() if s.frames}}


def hosts_straggler(states: dict[str, HostState], named: int | None = None
                    ) -> Straggler | None:
    """The straggler among every host's ranks, from the paces each host published;
    ``named``: the rank named at the previous look (find_straggler keeps it while it stays
    near the bar)."""
    paces: dict[int, list[StepPace]] = {}
    names: dict[int, dict[str, Any]] = {}
    labels: dict[int, str] = {}
    frames: dict[int, dict[str, Any]] = {}
    for state in states.values():
        paces.update(state.paces)
        frames.update(state.frames)
        for rank in state.ranks:
            names[rank.rank], labels[rank.rank] = rank.names or {}, rank_label(rank)
    return find_straggler(paces, names, labels, frames, named)


def with_straggler(verdict: Verdict, straggler: dict[str, Any] | None) -> Verdict:
    """``verdict`` with the straggler's sentence after its reasons and in its facts."""
    if straggler is None:
        return verdict
    return Verdict(verdict.name, [*verdict.reasons, str(straggler["sentence"])],
                   {**verdict.facts.to_dict(), "straggler": straggler})


def _host_of(rank: RankEvidence) -> str | None:
    return (rank.names or {}).get("host")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + " UTC"


def _as_stopped(job: Evidence) -> Evidence:
    """The job as stopped at the shared stall (the ranks were stopped by nsadiag there)."""
    outcome = dataclasses.replace(job.outcome, killed_by_runner=True, kill_reason="stall")
    return dataclasses.replace(job, outcome=outcome)


def _before_loss(rank: RankEvidence) -> RankEvidence:
    """A rank whose peers went away, read as it stood before: its exception dropped."""
    return dataclasses.replace(rank, result=None, crash=None)


def waiting_for(ranks: Sequence[RankEvidence], odd: Sequence[int],
                groups: Sequence[JobGroup] = ()) -> list[str]:
    """"rank 0 on host1 (...) waits in collective #1 (all_reduce, DDP bucket 0, 4 tensors)
    for rank 3 on host2 (...)" for every rank that waits in a collective the ``odd`` ranks
    never issued; a group of ranks folded at the stall (``groups``: those with members not
    among ``ranks``) is one sentence: "1,023 ranks (rank 0 on host1 (...) and 1,022 more
    on 128 hosts) wait in all_reduce #1 (...) at train.py:40 for ..."."""
    culprits = [r for r in ranks if r.rank in set(odd)]
    if not culprits:
        return []
    names = " and ".join(rank_label(r) for r in culprits)
    by_rank = {r.rank: r for r in ranks}
    in_groups = {rank for g in groups for rank in g.ranks()}
    said = []
    for group in groups:
        if group.waiting is None or all(r in set(odd) for r in group.ranks()):
            continue
        host, first = group.representative()
        label = rank_label(by_rank[first]) if first in by_rank else f"rank {first} on {host}"
        said.append(f"{group.count:,} ranks ({label} and {group.count - 1:,} more on "
                    f"{len(group.members):,} host(s)) wait in {group.waiting} at "
                    f"{group.frames or 'no Python frame'} for {names}")
    for rank in ranks:
        waiting = waiting_in(rank)
        if rank in culprits or waiting is None or rank.rank in in_groups:
            continue
        said.append(f"{rank_label(rank)} waits in {describe_collective(waiting)} "
                    f"for {names}")
    return said


def folded_rows(groups: Sequence[JobGroup], rows: Sequence[dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """One row of the Ranks table per folded group: its members that are not rows of
    their own, read as its representative's row."""
    shown = {row.get("rank") for row in rows}
    by_rank = {row.get("rank"): row for row in rows}
    out = []
    for group in groups:
        hidden = [r for r in group.ranks() if r not in shown]
        if not hidden:
            continue
        host, first = group.representative()
        like = by_rank.get(first, {})
        hosts = sorted(h for h, members in group.members.items()
                       if any(r not in shown for r in members))
        out.append({"rank": None, "host": hosts[0] if len(hosts) == 1 else
                    f"{len(hosts):,} hosts", "local_rank": None, "node_rank": None,
                    "pid": None, "state": group.state, "issued": like.get("issued"),
                    "last_collective": like.get("last_collective"),
                    "waiting": group.waiting, "waiting_since_s": None,
                    "position": like.get("position"), "memory_per_step": None,
                    "memory_holder": None,
                    "folded": f"{len(hidden):,} ranks ({_span(hidden)}) as rank {first}"})
    return out


def _span(ranks: Sequence[int]) -> str:
    """"0-1022" for consecutive ranks, else the first and last with the count between."""
    if len(ranks) == 1:
        return str(ranks[0])
    if ranks[-1] - ranks[0] + 1 == len(ranks):
        return f"{ranks[0]}-{ranks[-1]}"
    return f"{ranks[0]}, ..., {ranks[-1]}"


LOST_NAMED = 8
"""Lost hosts told one sentence each; the others in one sentence more."""


def lost_sentences(view: HostsView, ranks: Sequence[RankEvidence]
                   ) -> tuple[list[str], list[dict[str, Any]]]:
    """"host H lost at T (...); its ranks ... last seen at: ..." for every lost host, and
    its row of the facts; its ranks are those of ``ranks`` on it, else those its last
    digest gave (its state's)."""
    reasons, rows = [], []
    for host in view.lost:
        state = view.states.get(host)
        theirs = [r for r in ranks if _host_of(r) == host] or (state.ranks if state else [])
        when = _clock(state.published_at) if state else "an unknown time (it never published)"
        where = "; ".join(f"{rank_label(r)}: {position(r)}" +
                          (f", waiting in {describe_collective(waiting_in(r))}"
                           if waiting_in(r) else "") for r in theirs) or "none published"
        reasons.append(f"host {host} lost at {when} (its last publication in the store; "
                       f"nothing from it since); its ranks "
                       f"{', '.join(str(r.rank) for r in theirs) or '(unknown)'} last seen "
                       f"at: {where}")
        rows.append({"host": host, "last_heard": state.published_at if state else None,
                     "ranks": [r.rank for r in theirs]})
    if len(reasons) > LOST_NAMED:  # the rest in one sentence (every one in the rows)
        rest = view.lost[LOST_NAMED:]
        reasons[LOST_NAMED:] = [f"{len(rest):,} more host(s) lost: {', '.join(rest[:20])}"
                                + (", ..." if len(rest) > 20 else "")]
    return reasons, rows


def _lost_verdict(job: Evidence, ranks: Sequence[RankEvidence], view: HostsView) -> Verdict:
    reasons, rows = lost_sentences(view, ranks)
    own = [r for r in ranks if _host_of(r) == view.host]
    if own:
        reasons.append(f"the ranks of {view.host} ("
                       + ", ".join(str(r.rank) for r in own) + ") lost their peers: a "
                       "consequence of the lost host, not a fault of their own")
    gone = [r for h in view.lost if h in view.states for r in view.states[h].ranks]
    first = next((r for r in ranks if _host_of(r) in view.lost), gone[0] if gone else None)
    facts = {"rank": first.rank if first else None, "world_size": len(ranks),
             "signal_name": None, "crash": None, "lost_hosts": rows,
             "hosts": view.to_dict(), "ranks": rank_table(ranks, job.outcome.ended_at)}
    return Verdict("CRASH", reasons, facts)


def silent_before_stall(view: HostsView) -> list[str]:
    """The lost hosts that had gone silent before the stall was decided: their last
    publication (or none) is more than HOSTS_LOST_AFTER_S older than the stall signal. A
    host alive at the signal publishes every HOSTS_PUBLISH_EVERY_S until it sees it; one
    that stopped well before is gone, and the stall (the other hosts' ranks waiting for
    its ranks) is a consequence of its loss. A host that was alive then but did not
    capture in time is not among them."""
    if view.stall is None or not isinstance(view.stall.get("t"), (int, float)):
        return []
    said, by = float(view.stall["t"]), view.stall.get("host")
    return [h for h in view.lost if h != by and (  # the host that said it was there then
        h not in view.states or view.states[h].published_at < said - HOSTS_LOST_AFTER_S)]


def _folded_sentence(groups: Sequence[JobGroup], ranks: Sequence[RankEvidence]) -> str:
    """How the job's ranks were folded at the stall, in one sentence."""
    have = {r.rank for r in ranks}
    total = sum(g.count for g in groups)
    hosts = len({h for g in groups for h in g.members})
    parts = "; ".join(f"{g.count:,} at {g.frames or 'no Python frame'}"
                      + (f" in {g.waiting}" if g.waiting else "") for g in groups[:4])
    more = f"; {len(groups) - 4} more group(s)" if len(groups) > 4 else ""
    return (f"{total:,} ranks on {hosts:,} hosts stood in {len(groups)} place(s) at the stall "
            f"({parts}{more}); the full samples of {len(have):,} crossed the store (every "
            f"rank outside the largest group and one per group), the others are read as "
            f"their group's first rank")


def decide_hosts(job: Evidence, ranks: Sequence[RankEvidence], view: HostsView) -> Verdict:
    """The verdict over every host's ranks (see the module docstring)."""
    ranks = sorted(ranks, key=lambda r: r.rank)
    if view.lost and view.stall is None:
        return with_straggler(_lost_verdict(job, ranks, view), view.straggler)
    silent = silent_before_stall(view)
    if silent:  # the stall clock ran out before the lost-host rule could apply
        stall = view.stall or {}
        lost = _lost_verdict(job, ranks, dataclasses.replace(view, lost=silent))
        lost.reasons.insert(1, f"host {stall.get('host')} decided a stall at "
                            f"{_clock(float(stall.get('t', 0)))}, after host(s) "
                            f"{', '.join(silent)} had gone silent: its ranks waited for "
                            f"ranks that were gone")
        return with_straggler(lost, view.straggler)
    preface: list[str] = []
    if view.stall is not None:
        decided_by = view.stall.get("host")
        lost_peers = [r for r in ranks if _host_of(r) == view.host and
                      (r.result or {}).get("exception")]
        if decided_by != view.host:
            preface.append(f"host {decided_by} decided a stall at "
                           f"{_clock(float(view.stall.get('t', 0)))}; every host captured "
                           f"its ranks in the same window")
        if lost_peers and not job.outcome.killed_by_runner:
            preface.append(f"the ranks of {view.host} ("
                           + ", ".join(str(r.rank) for r in lost_peers) + ") only lost "
                           "their peers when the stall was stopped elsewhere; they are read "
                           "as they stood before")
        ranks = [_before_loss(r) if r in lost_peers else r for r in ranks]
        job = _as_stopped(job)
    verdict = decide_ranks(job, ranks)
    facts = verdict.facts.to_dict()
    odd = verdict.facts.ranks.odd_ranks or []
    groups = folded(view.groups, [r.rank for r in ranks])
    waits = waiting_for(ranks, odd, groups)
    reasons = list(verdict.reasons)
    if groups:  # the ranks whose samples stayed on their hosts, in the table and the size
        facts["ranks"] = [*(facts.get("ranks") or []), *folded_rows(groups, facts.get(
            "ranks") or [])]
        facts["world_size"] = sum(g.count for g in view.groups)
        preface.append(_folded_sentence(view.groups, ranks))
    if odd:
        culprits = [r for r in ranks if r.rank in set(odd)]
        reasons.insert(0, "culprit: " + " and ".join(rank_label(r) for r in culprits) +
                       f" never issued collective #{verdict.facts.ranks.diverged_at}: "
                       + "; ".join(waits))
        facts["culprit_ranks"] = [{"rank": r.rank, **(r.names or {})} for r in culprits]
    if view.lost and view.stall is not None:  # lost at the stall: named, not decided over
        preface += lost_sentences(view, ranks)[0]
    if view.replaced:
        preface.append(f"host(s) {', '.join(view.replaced)}, first in the deciding order, "
                       f"never asked for the captures at the stall: lost; host "
                       f"{view.decider} decided in its place")
    reasons[1:1] = preface
    facts["hosts"] = view.to_dict()
    facts["waiting_for"] = waits
    return with_straggler(Verdict(verdict.name, reasons, facts), view.straggler)
