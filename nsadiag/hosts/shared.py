"""One host's share in the job's store while ``nsadiag run`` watches its command.

``SharedView(shape, host)`` connects to the store (nsadiag.hosts.address) lazily, since
the torchrun agent that hosts it starts after nsadiag; while the command runs,
``tick(ranks)`` publishes this host's ranks (every HOSTS_PUBLISH_EVERY_S; the others'
are read every HOSTS_READ_EVERY publications) and
``stall_elsewhere()`` says when another host has decided a stall. At a stall,
``say_stall()`` before the capture (the first host's signal stays in force; every host's
capture ends by ``window_ends``, the signal's time plus the capture window), then
``exchange(ranks)`` after it: this host's capture is published, every other host's
capture is waited for (its capture window plus HOSTS_CAPTURE_MARGIN_S at most), read,
and this host says it has read them, then waits (briefly) for the others to have read
too, so that no host stops its ranks (and with them, on the store's host, the store)
before every host has its evidence. A command that ended by itself (its ranks lost their
peers) ``settle``\\ s: it waits up to HOSTS_LOST_AFTER_S for a stall signal or for peers
that keep publishing, and names the hosts that went silent. A store that stops
answering ends the sharing; what was read by then is kept. ``view()`` is the typed
result for the record (nsadiag.hosts.merged.HostsView).

Each publication carries every rank's latest PUBLISH_PACES finished steps (their times
outside and inside collectives: nsadiag.verdict.straggler), and at every read of the
others' states this host looks for a straggler among every host's ranks: the latest one
seen goes into its record, so each host's report names it while the job still progresses
(a read costs no operation more for it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from nsadiag.hosts.address import JobShape
from nsadiag.hosts.link import HostLink, StoreGone
from nsadiag.hosts.merged import HostState, HostsView, hosts_straggler
from nsadiag.verdict.ranks import RankEvidence
from nsadiag.verdict.straggler import step_paces
from nsadiag.verdict.thresholds import (
    HOSTS_CAPTURE_MARGIN_S,
    HOSTS_LOST_AFTER_S,
    HOSTS_PUBLISH_EVERY_S,
)

PUBLISH_EVENTS = 40
PUBLISH_STARTED = 80
"""A rank's last events and started collectives that are published (the verdict reads
the last step's; the rest stay in the host's own record)."""
PUBLISH_PACES = 8
"""A rank's latest finished steps that are published (six numbers each): more than the
STRAGGLER_STEPS a straggler is decided over, so that ranks a step apart still share them."""
WAIT_STEP_S = 0.2
HOSTS_READ_EVERY = 5
"""While the command runs, the other hosts' states are read at every publication until
every host has been seen with its ranks, then at every fifth (every 10 s): what a lost
host's ranks were last seen doing; reading them at every publication would cost each host
every other host's state every 2 s."""


def _trimmed(rank: RankEvidence) -> RankEvidence:
    rank.events = rank.events[-PUBLISH_EVENTS:]
    rank.started = rank.started[-PUBLISH_STARTED:]
    return rank


class SharedView:
    """See the module docstring; ``clock`` and ``sleep`` are time.time and time.sleep."""

    def __init__(self, shape: JobShape, host: str, link: HostLink | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep):
        self.shape, self.host = shape, host
        self.clock, self.sleep = clock, sleep
        self.link = link if link is not None else (
            HostLink(shape.store, host) if shape.store is not None else None)
        self.why_alone = None if self.link is not None else (
            "the command names no store (no --rdzv-endpoint with c10d, no MASTER_ADDR:"
            "MASTER_PORT)")
        self.published_at = float("-inf")
        self.states: dict[str, HostState] = {}
        self.stall: dict[str, str | float] | None = None
        self.lost: list[str] = []
        self.gone: str | None = None
        self.hosts: list[str] = []
        self.ticks = 0
        self.straggler: dict[str, object] | None = None
        self.named: int | None = None
        """The straggler's rank at the latest read, None when none stood out then."""
        self.on_straggler: Callable[[dict[str, Any] | None], None] | None = None
        """Hears the straggler at every read of the others' states (None: none then)."""

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

    def _read(self) -> None:
        assert self.link is not None
        self.hosts = self.link.hosts()
        for host, data in self.link.states([h for h in self.hosts if h != self.host]).items():
            self.states[host] = HostState.from_dict(data)
        found = hosts_straggler(self.states, self.named)
        self.named = found.rank if found is not None else None
        if found is not None:
            self.straggler = {**found.to_dict(), "seen_at": self.clock()}
        if self.on_straggler is not None:
            self.on_straggler(self.straggler if found is not None else None)

    def _publish(self, phase: str, ranks: Sequence[RankEvidence],
                 frames: dict[int, dict[str, Any]] | None = None) -> None:
        assert self.link is not None
        now = self.clock()
        paces = {r.rank: step_paces(r.events)[-PUBLISH_PACES:] for r in ranks}
        if frames is None:  # a capture or an end: where its ranks were last seen stays
            frames = self.states[self.host].frames if self.host in self.states else {}
        state = HostState(self.host, phase, now, [_trimmed(r) for r in ranks], paces,
                          dict(frames))
        self.states[self.host] = state
        self.link.publish(state.to_dict())
        self.link.join()
        self.published_at = now

    def tick(self, ranks: Callable[[], Sequence[RankEvidence]],
             frames: Callable[[], dict[int, dict[str, Any]]] | None = None) -> None:
        """Publish this host's ranks when the last publication is HOSTS_PUBLISH_EVERY_S
        old, and read the others' (``ranks`` and ``frames``, each rank's hot frame, are
        only called then)."""
        if self.clock() - self.published_at < HOSTS_PUBLISH_EVERY_S or \
                not self._connected():
            return
        try:
            self._publish("live", ranks(), frames() if frames is not None else None)
            self.ticks += 1
            if self.ticks % HOSTS_READ_EVERY == 1 or not self._all_seen():
                self._read()
        except StoreGone as err:
            self._gone(err)

    def _all_seen(self) -> bool:
        """Whether every host of the job has been read with its ranks (until then the
        others are read at every publication)."""
        return len(self.hosts) >= self._expected() and all(
            self.states.get(h) is not None and self.states[h].ranks for h in self.hosts)

    def stall_elsewhere(self) -> bool:
        """Whether another host decided a stall (read at most once per poll)."""
        if self.stall is not None or not self._connected():
            return self.stall is not None
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

    def _wait(self, done: Callable[[], bool], seconds: float) -> bool:
        deadline = self.clock() + seconds
        while True:
            try:
                if done():
                    return True
            except StoreGone as err:
                self._gone(err)
                return False
            if self.clock() >= deadline:
                return False
            self.sleep(WAIT_STEP_S)

    def exchange(self, ranks: Sequence[RankEvidence], capture_window_s: float) -> None:
        """Publish this host's capture, read every other host's (see the module
        docstring): one counter is watched while the others capture, every state is read
        once."""
        if not self._connected():
            return
        link = self.link
        assert link is not None
        try:
            self._publish("captured", ranks)
            link.count("captured", 1)
            self.hosts = link.hosts()
        except StoreGone as err:
            self._gone(err)
            return
        expected = self._expected()
        self._wait(lambda: link.count("captured") >= expected,
                   capture_window_s + HOSTS_CAPTURE_MARGIN_S)
        if self.gone is not None:
            return
        try:
            self._read()
            captured = link.count("captured")
            link.count("read", 1)
        except StoreGone as err:
            self._gone(err)
            return
        self.lost = [h for h in self.hosts if h != self.host and
                     (self.states.get(h) is None or self.states[h].phase == "live")]
        self._wait(lambda: link.count("read") >= captured, HOSTS_CAPTURE_MARGIN_S)

    def settle(self, ranks: Sequence[RankEvidence], ended_ok: bool) -> None:
        """After a command that ended by itself: publish its end; unless it ended well
        (``ended_ok``: then the store's host may well be gone with its finished job, and
        nobody is lost), wait (up to HOSTS_LOST_AFTER_S) for a stall signal, or for every
        other host to publish again; a host that stayed silent is lost."""
        if self.link is None or self.link.store is None:
            return
        if ended_ok:  # and the others' latest steps, for the straggler
            try:
                self._publish("ended", ranks)
                self._read()
            except StoreGone as err:
                self._gone(err)
            return
        started = self.clock()
        seen = {h: s.published_at for h, s in self.states.items() if h != self.host}
        try:
            self._publish("ended", ranks)
        except StoreGone as err:
            self._gone(err)

        def answered() -> bool:
            if self.gone is not None:
                return False
            self.stall = self.link.stall() if self.stall is None else self.stall
            self._read()
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
                self.lost = sorted({*self.lost, *(h for h in self.states if h != self.host)})

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
                         dict(self.straggler) if self.straggler else None)

    def remote_ranks(self) -> list[RankEvidence]:
        """Every other host's ranks as last read: those of a host that captured them or
        ended, and those of a lost host (where they were last seen); a host still running
        has no last word on its ranks yet."""
        return [r for host, state in sorted(self.states.items()) if host != self.host and
                (state.phase != "live" or host in self.lost) for r in state.ranks]
