"""Ranks that stand in the same place, folded: what crosses the store at a stall.

At a stall each host groups its ranks by where they stand (``group_key``: the stack
classification, the collective they wait in with its sequence number, the innermost user
frames of their last sample) and publishes the groups with their members
(``HostGroups``: a few hundred bytes per host, whatever its number of ranks). The decider
folds every host's groups into the job's (``fold``) and asks for the full evidence of the
suspects (every rank outside the largest group) and of one representative of each group
(``wanted``); in a job of at most FULL_CAPTURE_RANKS ranks it asks for every rank, so a
small job is decided from every rank's own capture.

A folded rank is read as its group's representative: it stood where the representative
stood (the key says so), and its own stack samples never crossed the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nsadiag.probes import frames
from nsadiag.verdict.ranks import RankEvidence, describe_collective, waiting_in

FULL_CAPTURE_RANKS = 16
"""A job of at most this many ranks sends every rank's capture (a few dozen kB each)."""
SUSPECTS_MAX = 32
"""At most this many suspects' captures are asked for (the smallest groups first)."""
REPRESENTED_GROUPS = 16
"""At most this many groups get a representative's capture (the largest first)."""


def group_key(rank: RankEvidence) -> str:
    """Where the rank stands, in words: its state, the collective it waits in, its frames."""
    waiting = waiting_in(rank)
    collective = f"{waiting.get('op')} #{waiting.get('n')}" if waiting else "no collective"
    return f"{rank.state or 'unknown'} | {collective} | {rank.signature or 'no stack'}"


@dataclass
class RankGroup:
    """Ranks of one host that stand in the same place (``key``); ``waiting``: the collective
    they wait in, in words (None when none), ``frames``: the innermost frame of the user's
    code its first rank's last sample shows (user_line)."""

    key: str
    state: str | None
    waiting: str | None
    frames: str
    ranks: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "state": self.state, "waiting": self.waiting,
                "frames": self.frames, "ranks": self.ranks}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankGroup:
        return cls(str(data["key"]), data.get("state"), data.get("waiting"),
                   str(data.get("frames") or ""), [int(r) for r in data.get("ranks") or []])


def user_line(rank: RankEvidence) -> str:
    """The innermost frame of the user's own code in the rank's last sample (its main
    thread first), "main (train.py:57)"; its stack signature when no frame is the user's."""
    samples = rank.stall.samples if rank.stall is not None else []
    if samples:
        threads = sorted(frames.user_threads(samples[-1]),
                         key=lambda t: t.name != "MainThread")
        for thread in threads:
            own = next((f for f in thread.frames if frames.own_code(f)), None)
            if own is not None:
                return own.where()
    return rank.signature or ""


def host_groups(ranks: Sequence[RankEvidence]) -> list[RankGroup]:
    """This host's ranks grouped by ``group_key``, in the order of their lowest rank."""
    found: dict[str, RankGroup] = {}
    for rank in sorted(ranks, key=lambda r: r.rank):
        key = group_key(rank)
        if key not in found:
            waiting = waiting_in(rank)
            found[key] = RankGroup(key, rank.state,
                                   describe_collective(waiting) if waiting else None,
                                   user_line(rank), [])
        found[key].ranks.append(rank.rank)
    return list(found.values())


@dataclass
class JobGroup:
    """One group over every host: its members by host, and the rank that represents it
    (its lowest)."""

    key: str
    state: str | None
    waiting: str | None
    frames: str
    members: dict[str, list[int]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(ranks) for ranks in self.members.values())

    def representative(self) -> tuple[str, int]:
        return min(((host, r) for host, ranks in self.members.items() for r in ranks),
                   key=lambda hr: hr[1])

    def ranks(self) -> list[int]:
        return sorted(r for ranks in self.members.values() for r in ranks)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "state": self.state, "waiting": self.waiting,
                "frames": self.frames, "count": self.count,
                "members": {h: spans(ranks) for h, ranks in self.members.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobGroup:
        return cls(str(data["key"]), data.get("state"), data.get("waiting"),
                   str(data.get("frames") or ""),
                   {str(h): unspan(ranks) for h, ranks in (data.get("members") or {}).items()})


def spans(ranks: Sequence[int]) -> str:
    """"0-7,9" for the ranks 0 to 7 and 9: a host's members in a few bytes."""
    out: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def unspan(text: str | Sequence[int]) -> list[int]:
    """The ranks of ``spans``'s text (a list of ranks is taken as it is)."""
    if not isinstance(text, str):
        return [int(r) for r in text]
    ranks: list[int] = []
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        ranks += range(int(first), int(last or first) + 1)
    return ranks


def fold(by_host: dict[str, Sequence[RankGroup]]) -> list[JobGroup]:
    """Every host's groups as the job's, the largest first (ties: the lowest rank)."""
    job: dict[str, JobGroup] = {}
    for host, groups in sorted(by_host.items()):
        for group in groups:
            into = job.setdefault(group.key, JobGroup(group.key, group.state, group.waiting,
                                                      group.frames))
            into.members.setdefault(host, []).extend(group.ranks)
    return sorted(job.values(), key=lambda g: (-g.count, g.representative()[1]))


def wanted(groups: Sequence[JobGroup]) -> dict[str, list[int]]:
    """The ranks whose full capture the decider asks for, by host (see the module
    docstring)."""
    asked: dict[str, set[int]] = {}

    def ask(members: Iterable[tuple[str, int]]) -> None:
        for host, rank in members:
            asked.setdefault(host, set()).add(rank)

    if sum(g.count for g in groups) <= FULL_CAPTURE_RANKS:
        ask((h, r) for g in groups for h, ranks in g.members.items() for r in ranks)
    else:
        ask(g.representative() for g in groups[:REPRESENTED_GROUPS])
        suspects = sorted(((h, r) for g in groups[1:] for h, ranks in g.members.items()
                           for r in ranks), key=lambda hr: (_size(groups, hr), hr[1]))
        ask(suspects[:SUSPECTS_MAX])
    return {host: sorted(ranks) for host, ranks in sorted(asked.items())}


def _size(groups: Sequence[JobGroup], member: tuple[str, int]) -> int:
    host, rank = member
    return next(g.count for g in groups if rank in g.members.get(host, ()))


def folded(groups: Sequence[JobGroup], captured: Iterable[int]) -> list[JobGroup]:
    """The groups with members whose capture did not cross the store (read as their
    representative)."""
    have = set(captured)
    return [g for g in groups if any(r not in have for ranks in g.members.values()
                                     for r in ranks)]
