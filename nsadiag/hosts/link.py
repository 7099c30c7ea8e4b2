"""One host's link to the job's store: a TCPStore client with a short timeout, every
operation counted, every failure turned into ``StoreGone``.

Keys live under ``nsadiag/``: ``hosts`` (one line per host that joined: its name, its node
rank and whether the store runs on it; nsadiag.hosts.decider picks the decider from it),
``digest/<host>`` (a host's nsadiag.hosts.digest.HostDigest, set every publication),
``finding`` (the straggler the decider found in every digest, read by the other hosts),
``stall`` (the first stall any host decided: set once, by compare-and-set), and at a stall
``groups/<host>`` (its ranks folded: nsadiag.hosts.groups), ``want`` (the ranks whose
capture the decider asks for), ``capture/<host>`` (those of them on ``host``), ``merged``
(what the decider gathered, which every host decides over), ``decider`` (the host that
decides, set once by compare-and-set) and the counters ``captured`` (hosts that published
their groups), ``sent`` (hosts that sent the captures asked of them) and ``read`` (hosts
that read the merged evidence and may stop their ranks): a host waits on one key or one
counter, one operation per look, whatever the number of hosts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from nsadiag.hosts.address import StoreAddress
from nsadiag.verdict.thresholds import HOSTS_STORE_TIMEOUT_S

PREFIX = "nsadiag/"


@dataclass(frozen=True)
class HostEntry:
    """One line of the hosts' list: a host, its node rank (None when its launcher gave
    none) and whether the store runs on it."""

    host: str
    node_rank: int | None
    store_here: bool

    @classmethod
    def parse(cls, line: str) -> HostEntry:
        words = line.split()
        node = words[1] if len(words) > 1 else "-"
        return cls(words[0], int(node) if node.lstrip("-").isdigit() else None,
                   len(words) > 2 and words[2] == "1")


class StoreGone(RuntimeError):
    """The store did not answer (its host is gone, or was never reachable)."""


class HostLink:
    """``host``'s client of the store at ``address``; ``ops`` counts the operations it
    issued (the scale report's figure)."""

    def __init__(self, address: StoreAddress, host: str, store: Any = None,
                 timeout_s: float = HOSTS_STORE_TIMEOUT_S):
        self.address, self.host, self.timeout_s = address, host, timeout_s
        self.store = store
        self.ops = 0
        self.read_bytes = 0
        self.seen: set[str] = set()
        self.joined = False

    def connect(self) -> None:
        """Connect (once); StoreGone when the store is not up."""
        if self.store is None:
            from torch.distributed import TCPStore

            try:
                self.store = TCPStore(self.address.host, self.address.port, is_master=False,
                                      timeout=timedelta(seconds=self.timeout_s),
                                      wait_for_workers=False)
            except (RuntimeError, ValueError, OSError) as err:
                raise StoreGone(f"no store at {self.address}: {err}") from None

    def join(self, node_rank: int | None = None, store_here: bool = False) -> None:
        """Add this host to the hosts' list (once; after its first digest is published,
        so every listed host's digest can be read in one operation), with its node rank
        and whether the store runs on it."""
        if not self.joined:
            line = f"{self.host} {'-' if node_rank is None else node_rank} {int(store_here)}\n"
            self._op(lambda s: s.append(PREFIX + "hosts", line))
            self.joined = True

    def _op(self, call: Any) -> Any:
        if self.store is None:
            raise StoreGone(f"not connected to the store at {self.address}")
        self.ops += 1
        try:
            return call(self.store)
        except (RuntimeError, ValueError, OSError) as err:
            raise StoreGone(f"the store at {self.address} did not answer: "
                            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                            ) from None

    def entries(self) -> list[HostEntry]:
        """The hosts that joined, in joining order (one operation once this host joined)."""
        if not self.joined and not self._op(lambda s: s.check([PREFIX + "hosts"])):
            return []
        text = bytes(self._op(lambda s: s.get(PREFIX + "hosts"))).decode()
        return [HostEntry.parse(line) for line in text.splitlines() if line.strip()]

    def hosts(self) -> list[str]:
        """The names of the hosts that joined, in joining order."""
        return [entry.host for entry in self.entries()]

    def put(self, key: str, data: Any) -> int:
        """Set ``key`` to ``data`` as JSON; the bytes sent."""
        payload = json.dumps(data, separators=(",", ":"), default=str)
        self._op(lambda s: s.set(PREFIX + key, payload))
        return len(payload)

    def take(self, key: str) -> Any:
        """The JSON at ``key``, None while it is not set (one operation then, and one
        operation, the read, once this link has seen it set: a key is never unset)."""
        if key not in self.seen and not self._op(lambda s: s.check([PREFIX + key])):
            return None
        self.seen.add(key)
        return self._decoded(self._op(lambda s: s.get(PREFIX + key)))

    def take_many(self, keys: list[str]) -> list[Any]:
        """The JSON at each of ``keys`` (every one set), in one operation."""
        if not keys:
            return []
        return [self._decoded(v) for v in self._op(
            lambda s: s.multi_get([PREFIX + k for k in keys]))]

    def _decoded(self, value: Any) -> Any:
        raw = bytes(value)
        self.read_bytes += len(raw)
        return json.loads(raw.decode())

    def publish(self, digest: dict[str, Any]) -> int:
        """Set this host's digest; the bytes sent."""
        return self.put(f"digest/{self.host}", digest)

    def digests(self, hosts: list[str]) -> dict[str, dict[str, Any]]:
        """The published digest of each of ``hosts`` (joined hosts: each has one)."""
        values = self.take_many([f"digest/{h}" for h in hosts])
        return dict(zip(hosts, values, strict=True))

    def wait_for(self, key: str, seconds: float) -> bool:
        """Whether ``key`` is set within ``seconds``: one blocking wait in the store (a
        wait that times out is cancelled in the store, and the client stays usable)."""
        if self.store is None:
            raise StoreGone(f"not connected to the store at {self.address}")
        self.ops += 1
        try:
            self.store.wait([PREFIX + key], timedelta(seconds=max(seconds, 0.01)))
            return True
        except (RuntimeError, ValueError, OSError) as err:
            if "timeout" not in str(err).lower():
                raise StoreGone(f"the store at {self.address} did not answer: "
                                f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
                                ) from None
        return False

    def append(self, key: str, line: str) -> None:
        """Add ``line`` to the list at ``key``."""
        self._op(lambda s: s.append(PREFIX + key, line + "\n"))

    def lines(self, key: str) -> list[str]:
        """The lines of the list at ``key``, [] while it is not set."""
        if not self._op(lambda s: s.check([PREFIX + key])):
            return []
        raw = bytes(self._op(lambda s: s.get(PREFIX + key)))
        self.read_bytes += len(raw)
        return [line for line in raw.decode().splitlines() if line]

    def compare_set(self, key: str, expected: str, value: str) -> str:
        """Set ``key`` to ``value`` if it holds ``expected`` ("": it is not set); the value
        in force after."""
        return bytes(self._op(lambda s: s.compare_set(PREFIX + key, expected, value))).decode()

    def claim(self, key: str, value: str) -> str:
        """Set ``key`` to ``value`` unless it holds a value already; the value in force."""
        return bytes(self._op(lambda s: s.compare_set(PREFIX + key, "", value))).decode()

    def say_stall(self, signal: dict[str, Any]) -> dict[str, Any]:
        """Set the shared stall signal unless a host set it first; the signal in force."""
        desired = json.dumps(signal, separators=(",", ":"))
        held = self._op(lambda s: s.compare_set(PREFIX + "stall", "", desired))
        return json.loads(bytes(held).decode())

    def stall(self) -> dict[str, Any] | None:
        """The shared stall signal, None while no host has decided a stall."""
        if not self._op(lambda s: s.check([PREFIX + "stall"])):
            return None
        return json.loads(bytes(self._op(lambda s: s.get(PREFIX + "stall"))).decode())

    def count(self, name: str, by: int = 0) -> int:
        """Add ``by`` to the counter ``name`` ("captured", "read"); its value after."""
        return int(self._op(lambda s: s.add(PREFIX + name, by)))
