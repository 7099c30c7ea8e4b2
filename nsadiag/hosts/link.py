"""One host's link to the job's store: a TCPStore client with a short timeout, every
operation counted, every failure turned into ``StoreGone``.

Keys live under ``nsadiag/``: ``hosts`` (the names of the hosts that joined, one a line,
each after its first state), ``state/<host>`` (a host's published HostState), ``stall`` (the first
stall any host decided: set once, by compare-and-set), and the counters ``captured`` (hosts
that published their capture) and ``read`` (hosts that read every capture and may stop
their ranks): a host waits on one counter, one operation per look, whatever the number of
hosts.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from nsadiag.hosts.address import StoreAddress
from nsadiag.verdict.thresholds import HOSTS_STORE_TIMEOUT_S

PREFIX = "nsadiag/"


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

    def join(self) -> None:
        """Add this host to the hosts' list (once; after its first state is published, so
        every listed host's state can be read in one operation)."""
        if not self.joined:
            self._op(lambda s: s.append(PREFIX + "hosts", self.host + "\n"))
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

    def hosts(self) -> list[str]:
        """The hosts that joined, in joining order."""
        if not self._op(lambda s: s.check([PREFIX + "hosts"])):
            return []
        return bytes(self._op(lambda s: s.get(PREFIX + "hosts"))).decode().split()

    def publish(self, state: dict[str, Any]) -> None:
        """Set this host's state."""
        payload = json.dumps(state, separators=(",", ":"), default=str)
        self._op(lambda s: s.set(f"{PREFIX}state/{self.host}", payload))

    def states(self, hosts: list[str]) -> dict[str, dict[str, Any]]:
        """The published state of each of ``hosts`` (joined hosts: each has one)."""
        if not hosts:
            return {}
        values = self._op(lambda s: s.multi_get([f"{PREFIX}state/{h}" for h in hosts]))
        return {h: json.loads(bytes(v).decode()) for h, v in zip(hosts, values, strict=True)}

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
