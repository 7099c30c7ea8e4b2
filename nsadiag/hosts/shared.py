"""One host's share in the job's store while ``nsadiag run`` watches its command.

``SharedView(shape, host)`` connects to the store (nsadiag.hosts.address) lazily, since
the torchrun agent that hosts it starts after nsadiag. The job has one decider
(nsadiag.hosts.decider: the host of the store, else the lowest node rank); the sharing is
O(N) in the hosts:

- **While the command runs** ``tick(ranks)`` publishes this host's digest
  (nsadiag.hosts.digest: about 0.4 kB per rank) every HOSTS_PUBLISH_EVERY_S, and
  ``stall_elsewhere()`` looks for the shared stall signal at most every HOSTS_STALL_LOOK_S.
  At every HOSTS_READ_EVERY-th publication the decider reads every host's digest, looks
  for a straggler among their ranks and publishes it under ``finding``; every other host
  reads that one key. A host costs the store under 2 operations a second.
- **At a stall** ``say_stall()`` before the capture (the first host's signal stays in
  force; every host's capture ends by ``window_ends``), then ``exchange(ranks)`` after it:
  this host publishes its ranks folded into groups (nsadiag.hosts.groups: a few hundred
  bytes); the decider waits for every host's groups (the capture window plus
  HOSTS_CAPTURE_MARGIN_S at most), folds them into the job's and asks (``want``) for the
  full capture of the suspects and of one representative per group (of every rank in a
  small job); the hosts asked send them; the decider publishes the merged evidence (the
  groups, the captures, the hosts that never captured with their last digests) under
  ``merged``, which every host reads and decides over (nsadiag.hosts.merged). Each host
  says it has read it and waits (briefly) for the others, so that no host stops its ranks
  (and with them, on the store's host, the store) before every host has its evidence. A
  decider that does not ask within HOSTS_DECIDER_MARGIN_S past the capture margin is lost:
  the next host in the deciding order that captured decides in its place, and the
  verdict names the lost one.
- **A command that ended by itself** (its ranks lost their peers) ``settle``\\ s: it waits
  up to HOSTS_LOST_AFTER_S for a stall signal or for peers that keep publishing, names the
  hosts that went silent, and reads the full ranks of the few hosts whose ranks raised
  first (SETTLE_HOSTS at most).

A store that stops answering ends the sharing; what was read by then is kept. ``view()``
is the typed result for the record (nsadiag.hosts.merged.HostsView).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from nsadiag.hosts.address import JobShape
from nsadiag.hosts.decider import deciding_order, next_decider, store_is_here
from nsadiag.hosts.digest import HostDigest
from nsadiag.hosts.groups import JobGroup, RankGroup, fold, host_groups, wanted
from nsadiag.hosts.link import HostEntry, HostLink, StoreGone
from nsadiag.hosts.merged import HostState, HostsView, hosts_straggler
from nsadiag.verdict.ranks import PEER_GONE, RankEvidence
from nsadiag.verdict.thresholds import (
    HOSTS_CAPTURE_MARGIN_S,
    HOSTS_DECIDER_MARGIN_S,
    HOSTS_LOST_AFTER_S,
    HOSTS_PUBLISH_EVERY_S,
    HOSTS_STALL_LOOK_S,
)

PUBLISH_EVENTS = 40
PUBLISH_STARTED = 80
"""A rank's last events and started collectives in a capture or an end that crosses the
store (the verdict reads the last step's; the rest stay in the host's own record)."""
LOST_DIGESTS = 16
"""At most this many hosts that never captured are sent with their last digest (where
their ranks were last seen); the rest are named only."""
WAIT_STEP_S = 0.2
HOSTS_READ_EVERY = 5
"""While the command runs the decider reads every digest (and the others its finding) at
every fifth publication (every 10 s), and at every one until every host has joined."""
SETTLE_HOSTS = 8
"""After a command that ended badly, the full ranks of at most this many hosts are read:
those whose ranks raised first (an exception that is not a lost peer before one that is)."""


def _trimmed(rank: RankEvidence) -> dict[str, Any]:
    data = rank.to_dict()
    data["events"] = data["events"][-PUBLISH_EVENTS:]
    data["started"] = data["started"][-PUBLISH_STARTED:]
    return data


def _node_rank(ranks: Sequence[RankEvidence]) -> int | None:
    for rank in ranks:
        node = (rank.names or {}).get("node_rank")
        if isinstance(node, int) or (isinstance(node, str) and node.isdigit()):
            return int(node)
    return None


class SharedView:
    """See the module docstring; ``clock`` and ``sleep`` are time.time and time.sleep;
    ``store_here``: whether the store runs on this host (None: from its address)."""

    def __init__(self, shape: JobShape, host: str, link: HostLink | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 store_here: bool | None = None):
        self.shape, self.host = shape, host
        self.clock, self.sleep = clock, sleep
        self.link = link if link is not None else (
            HostLink(shape.store, host) if shape.store is not None else None)
        self.store_here = store_here
        self.why_alone = None if self.link is not None else (
            "the command names no store (no --rdzv-endpoint with c10d, no MASTER_ADDR:"
            "MASTER_PORT)")
        self.published_at = float("-inf")
        self.looked_at = float("-inf")
        self.states: dict[str, HostState] = {}
        self.stall: dict[str, str | float] | None = None
        self.lost: list[str] = []
        self.gone: str | None = None
        self.entries: list[HostEntry] = []
        self._ordered: tuple[int, list[str]] = (0, [])
        self._named: tuple[int, list[str]] = (0, [])
        self.ticks = 0
        self.straggler: dict[str, object] | None = None
        self.named: int | None = None
        """The straggler's rank at the decider's latest read, None when none stood out."""
        self.finding_read = False
        self.on_straggler: Callable[[dict[str, Any] | None], None] | None = None
        """Hears the straggler at every read of it (None: none then)."""
        self.groups: list[JobGroup] = []
        self.remote: list[RankEvidence] = []
        self.decider: str | None = None
        self.replaced: list[str] = []
        """Deciders lost at the stall, in the order they were replaced."""
        self.captured_at: dict[str, float] = {}
        """The decider's: when each host that captured published its groups."""
        self.marks: dict[str, float] = {}
        """When (this host's clock) each step of the exchange at a stall was done: "groups"
        published, "asked" (the decider's request read), "sent", "merged" read; the
        decider's "gathered" too."""

    @property
    def hosts(self) -> list[str]:
        """The hosts that joined, each once, in joining order."""
        if self._named[0] != len(self.entries):
            self._named = (len(self.entries),
                           list(dict.fromkeys(entry.host for entry in self.entries)))
        return self._named[1]

    # ---- the store, while it answers ------------------------------------------------------

    def _connected(self) -> bool:
        if self.link is None or self.gone is not None:
            return False
        try:
            self.link.connect()
            return True
        except StoreGone:
            return False

    def _gone(self, err: StoreGone) -> None:
        self.gone = str(err)

    def _order(self) -> list[str]:
        """The deciding order of the hosts that joined (computed again only when more
        joined)."""
        if self._ordered[0] != len(self.entries):
            self._ordered = (len(self.entries), deciding_order(self.entries))
        return self._ordered[1]

    def deciding(self) -> bool:
        """Whether this host decides for the job (the first of the deciding order)."""
        order = self._order()
        return bool(order) and order[0] == self.host

    def _publish(self, phase: str, ranks: Sequence[RankEvidence],
                 frames: dict[int, dict[str, Any]] | None = None) -> None:
        assert self.link is not None
        now = self.clock()
        if frames is None:  # a capture or an end: where its ranks were last seen stays
            frames = self.states[self.host].frames if self.host in self.states else {}
        digest = HostDigest.of(self.host, phase, now, ranks, frames)
        self.states[self.host] = HostState(self.host, phase, now, [], digest.paces(),
                                           dict(frames))
        self.link.publish(digest.to_dict())
        if self.store_here is None:
            self.store_here = store_is_here(self.shape.store)
        self.link.join(_node_rank(ranks), self.store_here)
        self.published_at = now

    def _take_digests(self, hosts: Sequence[str]) -> None:
        assert self.link is not None
        for host, data in self.link.digests(list(hosts)).items():
            self.states[host] = _state_of(HostDigest.from_dict(data))

    def _look(self) -> None:
        """The decider reads every digest and publishes the straggler; another host reads
        what the decider published."""
        assert self.link is not None
        if self.deciding():
            self._take_digests([h for h in self.hosts if h != self.host])
            found = hosts_straggler(self.states, self.named)
            self.named = found.rank if found is not None else None
            self.straggler = {**found.to_dict(), "seen_at": self.clock()} \
                if found is not None else None
            self.link.put("finding", {"straggler": self.straggler, "by": self.host})
        else:
            finding = self.link.take("finding")
            self.finding_read = self.finding_read or finding is not None
            self.straggler = (finding or {}).get("straggler")
            rank = self.straggler.get("rank") if self.straggler else None
            self.named = rank if isinstance(rank, int) else None
        if self.on_straggler is not None:
            self.on_straggler(self.straggler)

    def tick(self, ranks: Callable[[], Sequence[RankEvidence]],
             frames: Callable[[], dict[int, dict[str, Any]]] | None = None) -> None:
        """Publish this host's digest when the last publication is HOSTS_PUBLISH_EVERY_S
        old, and read the hosts' list until every host joined, the digests or the finding
        at every HOSTS_READ_EVERY-th (``ranks`` and ``frames``, each rank's hot frame, are
        only called then)."""
        if self.clock() - self.published_at < HOSTS_PUBLISH_EVERY_S or \
                not self._connected():
            return
        assert self.link is not None
        try:
            self._publish("live", ranks(), frames() if frames is not None else None)
            self.ticks += 1
            if not self._all_joined():  # the finding is read once every host is in
                self.entries = self.link.entries()
            elif self.ticks % HOSTS_READ_EVERY == 1 or not self._all_seen():
                self._look()
        except StoreGone as err:
            self._gone(err)

    def _all_joined(self) -> bool:
        return len(self.hosts) >= self._expected()

    def _all_seen(self) -> bool:
        """Whether the decider has read every host with its ranks (another host: whether
        it has read the decider's finding once)."""
        if not self.deciding():
            return self._all_joined() and self.finding_read
        return self._all_joined() and all(
            self.states.get(h) is not None and self.states[h].ranks for h in self.hosts
            if h != self.host)

    def stall_elsewhere(self) -> bool:
        """Whether a host decided a stall (looked at most every HOSTS_STALL_LOOK_S)."""
        if self.stall is not None or not self._connected():
            return self.stall is not None
        now = self.clock()
        if now - self.looked_at < HOSTS_STALL_LOOK_S:
            return False
        self.looked_at = now
        assert self.link is not None
        try:
            self.stall = self.link.stall()
        except StoreGone as err:
            self._gone(err)
        return self.stall is not None

    def say_stall(self) -> None:
        """Say in the store that this host decided a stall (the first signal stays)."""
        if not self._connected():
            return
        assert self.link is not None
        try:
            self.stall = self.link.say_stall({"host": self.host, "t": self.clock()})
        except StoreGone as err:
            self._gone(err)

    def window_ends(self, capture_window_s: float) -> float | None:
        """When the capture window the hosts share ends (time.time()): the first host's
        stall signal plus the capture window; None without a signal."""
        if self.stall is None or not isinstance(self.stall.get("t"), (int, float)):
            return None
        return float(self.stall["t"]) + capture_window_s

    def _expected(self) -> int:
        return max(self.shape.nnodes or 0, len(self.hosts), 1)

    def _wait(self, done: Callable[[], Any], seconds: float) -> Any:
        """``done()``'s first true answer within ``seconds``, else None (StoreGone ends the
        wait)."""
        deadline = self.clock() + seconds
        while True:
            try:
                answer = done()
                if answer:
                    return answer
            except StoreGone as err:
                self._gone(err)
                return None
            if self.clock() >= deadline:
                return None
            self.sleep(WAIT_STEP_S)

    # ---- at a stall -------------------------------------------------------------------------

    def exchange(self, ranks: Sequence[RankEvidence], capture_window_s: float) -> None:
        """Publish this host's groups, send the captures the decider asks for, read the
        merged evidence (see the module docstring). Every wait is one blocking wait on
        one key in the store (the last host to add to a counter sets it), never a poll."""
        if not self._connected():
            return
        link = self.link
        assert link is not None
        own = {r.rank: r for r in ranks}
        try:
            now = self.clock()
            link.put(f"groups/{self.host}", {"published_at": now, "groups": [
                g.to_dict() for g in host_groups(list(own.values()))]})
            state = self.states.get(self.host)
            self.states[self.host] = HostState(self.host, "captured", now, [],
                                               state.paces if state else {},
                                               state.frames if state else {})
            link.append("captured_hosts", self.host)
            if not self._all_joined():  # the deciding order is read once every host is in
                self.entries = link.entries()
            if link.count("captured", 1) >= self._expected():
                link.put("all_captured", 1)
            self.marks["groups"] = self.clock()
        except StoreGone as err:
            self._gone(err)
            return
        merged = self._merged(own, capture_window_s)
        if merged is None or self.gone is not None:
            return
        self._take_merged(merged)
        self.marks["merged"] = self.clock()
        try:
            if link.count("read", 1) >= len(merged.get("captured") or {}):
                link.put("all_read", 1)
            link.wait_for("all_read", HOSTS_CAPTURE_MARGIN_S)
        except StoreGone as err:
            self._gone(err)

    def _merged(self, own: dict[int, RankEvidence], capture_window_s: float
                ) -> dict[str, Any] | None:
        """The merged evidence the decider published: this host decides when it is first
        in the deciding order, or when the deciders before it were lost."""
        link = self.link
        assert link is not None
        order = self._order()
        lost: list[str] = []
        decider = order[0] if order else self.host
        patience = capture_window_s + HOSTS_CAPTURE_MARGIN_S + HOSTS_DECIDER_MARGIN_S
        try:
            for _ in range(len(order) + 1):  # each turn the decider decides or is lost
                if decider == self.host:
                    self._ask(capture_window_s, lost)
                if not link.wait_for(f"want/{decider}", patience):
                    lost.append(decider)  # the next host in the order that captured decides
                    decider = next_decider(order, link.lines("captured_hosts"), lost) \
                        or self.host
                    patience = HOSTS_CAPTURE_MARGIN_S + HOSTS_DECIDER_MARGIN_S
                    continue
                want = link.take(f"want/{decider}")
                self.marks["asked"] = self.clock()
                mine = [own[r] for r in (want["ranks"].get(self.host) or []) if r in own]
                if mine:
                    link.put(f"capture/{decider}/{self.host}", [_trimmed(r) for r in mine])
                    link.append(f"sent_hosts/{decider}", self.host)
                    if link.count(f"sent/{decider}", 1) >= int(want["asked"]):
                        link.put(f"all_sent/{decider}", 1)
                    self.marks["sent"] = self.clock()
                if decider == self.host:  # what it published, without reading it back
                    merged = self._gather(lost)
                    self.marks["gathered"] = self.clock()
                    return merged
                if not link.wait_for(f"merged/{decider}", patience):
                    return None
                merged = link.take(f"merged/{decider}")
                self.marks["fetched"] = self.clock()
                return merged
        except StoreGone as err:
            self._gone(err)
        return None

    def _ask(self, capture_window_s: float, lost: list[str]) -> None:
        """The decider: wait for every host's groups, fold them, ask for the captures."""
        link = self.link
        assert link is not None
        # in place of a lost decider the wait for every host's groups is over already
        if not lost and link.count("captured") < self._expected():
            link.wait_for("all_captured", capture_window_s + HOSTS_CAPTURE_MARGIN_S)
        alive = list(dict.fromkeys(link.lines("captured_hosts")))
        published = dict(zip(alive, link.take_many([f"groups/{h}" for h in alive]),
                             strict=True))
        self.groups = fold({h: [RankGroup.from_dict(g) for g in data["groups"]]
                            for h, data in published.items()})
        self.captured_at = {h: data["published_at"] for h, data in published.items()}
        asked = wanted(self.groups)
        link.put(f"want/{self.host}", {"decider": self.host, "ranks": asked,
                                       "asked": sum(1 for ranks in asked.values() if ranks)})

    def _gather(self, lost: list[str]) -> dict[str, Any]:
        """The decider: wait for the captures asked for, publish the merged evidence (and
        return it)."""
        link = self.link
        assert link is not None
        key = f"all_sent/{self.host}"
        link.wait_for(key, HOSTS_CAPTURE_MARGIN_S)
        sent = list(dict.fromkeys(link.lines(f"sent_hosts/{self.host}")))
        ranks = [r for batch in link.take_many([f"capture/{self.host}/{h}" for h in sent])
                 for r in batch]
        silent = [h for h in self.hosts if h not in self.captured_at]
        since = min(self.captured_at.values(), default=0.0)
        named = silent[:LOST_DIGESTS]
        digests = dict(zip(named, link.take_many([f"digest/{h}" for h in named]),
                           strict=True))
        merged = {
            "decider": self.host, "replaced": lost, "groups": [g.to_dict() for g in self.groups],
            "ranks": ranks, "lost": silent, "digests": digests,
            # when each host published its groups, as seconds after the first (short)
            "captured_from": since, "captured": {
                h: round(t - since, 2) for h, t in sorted(self.captured_at.items())}}
        link.put(f"merged/{self.host}", merged)
        return merged

    def _take_merged(self, merged: dict[str, Any]) -> None:
        self.decider = str(merged["decider"])
        self.replaced = [str(h) for h in merged.get("replaced") or []]
        self.groups = [JobGroup.from_dict(g) for g in merged.get("groups") or []]
        self.remote = [RankEvidence.from_dict(r) for r in merged.get("ranks") or []
                       if (r.get("names") or {}).get("host") != self.host]
        since = float(merged.get("captured_from") or 0.0)
        for host, after in (merged.get("captured") or {}).items():
            if host != self.host:
                self.states[host] = HostState(host, "captured", since + float(after))
        for host, data in (merged.get("digests") or {}).items():
            self.states[host] = _state_of(HostDigest.from_dict(data))
        self.lost = sorted({*(h for h in merged.get("lost") or [] if h != self.host),
                            *(h for h in self.replaced if h != self.host)})

    # ---- after a command that ended by itself -------------------------------------------------

    def settle(self, ranks: Sequence[RankEvidence], ended_ok: bool) -> None:
        """After a command that ended by itself: publish its end; unless it ended well
        (``ended_ok``: then the store's host may well be gone with its finished job, and
        nobody is lost), wait (up to HOSTS_LOST_AFTER_S) for a stall signal, or for every
        other host to publish again; a host that stayed silent is lost."""
        if self.link is None or self.link.store is None:
            return
        link = self.link
        if ended_ok:  # and the straggler over the latest steps
            try:
                self._publish("ended", ranks)
                self.entries = link.entries()
                self._look()
            except StoreGone as err:
                self._gone(err)
            return
        started = self.clock()
        seen = {h: s.published_at for h, s in self.states.items() if h != self.host}
        try:
            self._publish("ended", ranks)
            link.put(f"ended/{self.host}", [_trimmed(r) for r in ranks])
        except StoreGone as err:
            self._gone(err)

        def answered() -> bool:
            if self.gone is not None:
                return False
            self.stall = link.stall() if self.stall is None else self.stall
            self.entries = link.entries()
            self._take_digests([h for h in self.hosts if h != self.host])
            others = [h for h in self.hosts if h != self.host]
            return self.stall is not None or all(
                self.states.get(h) is not None and
                (self.states[h].published_at > seen.get(h, float("-inf")) or
                 self.states[h].phase != "live") for h in others)

        if not self._wait(answered, HOSTS_LOST_AFTER_S) and self.stall is None:
            self.lost = [h for h in self.hosts if h != self.host and
                         (self.states.get(h) is None or
                          self.states[h].published_at <= seen.get(h, float("-inf")) or
                          self.states[h].published_at < started - HOSTS_LOST_AFTER_S)]
            if self.gone is not None:  # the store went with its host: every peer is silent
                self.lost = sorted({*self.lost, *(h for h in [*self.states, *self.hosts]
                                                  if h != self.host)})
        self._take_ended()

    def _take_ended(self) -> None:
        """The full ranks of the hosts (SETTLE_HOSTS at most) whose ranks raised first; the
        others' ranks as their digests know them."""
        ended = {h: s for h, s in self.states.items() if h != self.host and s.phase == "ended"}
        firsts = {h: _first_raise(s) for h, s in ended.items()}
        raised = sorted(((t, h) for h, t in firsts.items() if t is not None),
                        key=lambda th: th[0])
        chosen = [h for _, h in raised[:SETTLE_HOSTS]]
        full: dict[str, list[RankEvidence]] = {}
        if chosen and self.gone is None:
            assert self.link is not None
            try:
                for host, batch in zip(chosen, self.link.take_many(
                            [f"ended/{h}" for h in chosen]), strict=True):
                    full[host] = [RankEvidence.from_dict(r) for r in batch]
            except StoreGone as err:
                self._gone(err)
        self.remote = [r for host, state in sorted(self.states.items()) if host != self.host
                       and (state.phase != "live" or host in self.lost)
                       for r in full.get(host, state.ranks)]

    # ---- the result ------------------------------------------------------------------------

    def view(self) -> HostsView:
        """What this host knows of the others, for the record."""
        if self.link is None:
            mode = f"per-host view: {self.why_alone}"
        elif self.link.store is None:
            mode = (f"per-host view: the store at {self.link.address} "
                    f"({self.link.address.source}) never answered")
        else:
            mode = f"shared through {self.link.address.source} at {self.link.address}"
            if self.gone is not None:
                mode += f"; it stopped answering ({self.gone})"
        return HostsView(self.host, mode, self.link is not None and self.link.store is not None,
                         dict(self.states), dict(self.stall) if self.stall else None,
                         list(self.lost), self.link.ops if self.link is not None else 0,
                         dict(self.straggler) if self.straggler else None,
                         list(self.groups), self.decider, list(self.replaced))

    def remote_ranks(self) -> list[RankEvidence]:
        """Every other host's ranks as this host has them: at a stall those the decider
        gathered (the suspects, the groups' representatives; a lost host's ranks, as its
        last digest saw them, are in its state); after an end, the ranks of the hosts that
        ended or were lost."""
        return sorted(self.remote, key=lambda r: r.rank)


def _state_of(digest: HostDigest) -> HostState:
    """A host's state as its digest gives it (its ranks as far as the digest knows them)."""
    return HostState(digest.host, digest.phase, digest.published_at,
                     [r.as_rank() for r in digest.ranks], digest.paces(), digest.frames())


def _first_raise(state: HostState) -> tuple[int, float] | None:
    """(0 for an exception that is not a lost peer, else 1; its time) of the host's first
    raise, None when its ranks raised nothing."""
    found = [(1 if PEER_GONE.search(str(r.result["exception"].get("message", ""))) else 0,
              float(r.result["exception"].get("t") or 0.0))
             for r in state.ranks if r.result and r.result.get("exception")]
    return min(found) if found else None
