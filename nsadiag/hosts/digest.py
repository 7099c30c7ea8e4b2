"""What one host publishes about its ranks while the job runs: a digest of each rank.

A ``RankDigest`` is about 0.3-0.5 kB: the rank's names (host, global, local, node rank),
its last module event (where it is), the collective it waits in (op, sequence number,
what it carries, since when) and how many it issued, its latest finished steps' paces
(the straggler is decided over them: nsadiag.verdict.straggler) and the user frame its
sampler saw most. ``HostDigest`` is one host's publication: its name, phase ("live",
"ended"), when, and its ranks' digests. The decider (nsadiag.hosts.shared) reads every
host's digest; a rank's full evidence crosses the store only at a stall, and only for the
ranks the decider asks for (nsadiag.hosts.groups).

``RankDigest.as_rank()`` is the rank as far as the digest knows it: a RankEvidence whose
``position`` and ``waiting_in`` read as the full one's did (a lost host's ranks are named
with where they were last seen from it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nsadiag.verdict.ranks import RankEvidence, exception_time, waiting_in
from nsadiag.verdict.straggler import StepPace, step_paces

DIGEST_PACES = 8
"""A rank's latest finished steps in its digest (six numbers each): more than the
STRAGGLER_STEPS a straggler is decided over, so that ranks a step apart still share them."""
_WAIT_KEYS = ("op", "n", "detail", "t", "step", "phase", "origin")
"""What the digest keeps of the collective a rank waits in (its shapes stay behind)."""


def _where(rank: RankEvidence) -> dict[str, Any] | None:
    """The rank's last module event (nsadiag.verdict.ranks.position reads it), else its last
    event's phase; None without events."""
    for event in reversed(rank.events):
        if event.get("kind") == "module":
            return {k: event.get(k) for k in ("t", "kind", "module", "phase", "step", "edge")
                    if event.get(k) is not None}
    return {k: rank.events[-1].get(k) for k in ("t", "phase")} if rank.events else None


def _raised(rank: RankEvidence) -> dict[str, Any] | None:
    exception = (rank.result or {}).get("exception")
    if not exception:
        return None
    message = str(exception.get("message") or "").splitlines()
    return {"type": exception.get("type"), "message": message[0][:200] if message else "",
            "t": exception_time(rank)}


@dataclass
class RankDigest:
    """One rank in a few hundred bytes (see the module docstring)."""

    rank: int
    names: dict[str, Any] | None
    where: dict[str, Any] | None
    waiting: dict[str, Any] | None
    issued: int
    paces: list[StepPace] = field(default_factory=list)
    frame: dict[str, Any] | None = None
    raised: dict[str, Any] | None = None
    """The exception its result holds ({"type", "message": its first line, "t"}), None
    when none: which hosts' full ranks a job that ended badly reads."""

    @classmethod
    def of(cls, rank: RankEvidence, frame: dict[str, Any] | None = None) -> RankDigest:
        waiting = waiting_in(rank)
        return cls(rank.rank, rank.names, _where(rank),
                   {k: waiting[k] for k in _WAIT_KEYS if k in waiting} if waiting else None,
                   int((rank.collectives or {}).get("issued", 0) or 0),
                   step_paces(rank.events)[-DIGEST_PACES:], frame, _raised(rank))

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "names": self.names, "where": self.where,
                "waiting": self.waiting, "issued": self.issued,
                "paces": [[round(x, 4) if isinstance(x, float) else x for x in p.to_list()]
                          for p in self.paces], "frame": self.frame,
                "raised": self.raised}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankDigest:
        return cls(int(data["rank"]), data.get("names"), data.get("where"),
                   data.get("waiting"), int(data.get("issued") or 0),
                   [StepPace.from_list(p) for p in data.get("paces") or []],
                   data.get("frame"), data.get("raised"))

    def as_rank(self) -> RankEvidence:
        """The rank as its digest knows it (see the module docstring)."""
        events = [self.where] if self.where else []
        result = {"status": "error", "exception": dict(self.raised)} if self.raised else None
        if self.raised:  # when it raised (nsadiag.verdict.ranks.exception_time reads it)
            events.append({"t": self.raised.get("t"), "kind": "end"})
        return RankEvidence(rank=self.rank, pid=None, events=events, event_counts={},
                            result=result,
                            collectives={"open": [self.waiting] if self.waiting else [],
                                         "issued": self.issued},
                            names=self.names)


@dataclass
class HostDigest:
    """One host's publication while its ranks run or after they ended."""

    host: str
    phase: str
    published_at: float
    ranks: list[RankDigest] = field(default_factory=list)

    @classmethod
    def of(cls, host: str, phase: str, now: float, ranks: Sequence[RankEvidence],
           frames: dict[int, dict[str, Any]]) -> HostDigest:
        return cls(host, phase, now, [RankDigest.of(r, frames.get(r.rank)) for r in ranks])

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "phase": self.phase, "published_at": self.published_at,
                "ranks": [r.to_dict() for r in self.ranks]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostDigest:
        return cls(str(data["host"]), str(data["phase"]), float(data["published_at"]),
                   [RankDigest.from_dict(r) for r in data.get("ranks") or []])

    def paces(self) -> dict[int, list[StepPace]]:
        return {r.rank: r.paces for r in self.ranks}

    def frames(self) -> dict[int, dict[str, Any]]:
        return {r.rank: r.frame for r in self.ranks if r.frame}
