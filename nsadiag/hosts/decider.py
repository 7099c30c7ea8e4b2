"""Which host decides for the job: the host of the store, else the lowest node rank.

One host alone reads every host's digest, looks for the straggler, asks at a stall for the
captures it needs and gathers the merged evidence (nsadiag.hosts.shared). Every host
computes the same ``deciding_order`` from the hosts' list in the store (a host that runs
the store first, then by node rank, a host without one last, then in joining order), so
none has to be told who decides; when the first is lost at a stall, the next one in the
order that captured decides in its place.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from nsadiag.hosts.address import StoreAddress
from nsadiag.hosts.link import HostEntry


def deciding_order(entries: Sequence[HostEntry]) -> list[str]:
    """The hosts in the order they decide (see the module docstring), each once."""
    first: dict[str, tuple[int, HostEntry]] = {}
    for index, entry in enumerate(entries):
        first.setdefault(entry.host, (index, entry))
    ranked = sorted(first.values(), key=lambda ie: (
        not ie[1].store_here, ie[1].node_rank is None,
        ie[1].node_rank if ie[1].node_rank is not None else 0, ie[0]))
    return [entry.host for _, entry in ranked]


def next_decider(order: Sequence[str], alive: Sequence[str], lost: Sequence[str]) -> str | None:
    """The first host of ``order`` that is ``alive`` (it captured) and not ``lost``."""
    here, gone = set(alive), set(lost)
    return next((h for h in order if h in here and h not in gone), None)


def store_is_here(address: StoreAddress | None) -> bool:
    """Whether the store's address names this machine: its host name, or the address its
    host name resolves to (a host whose name does not resolve never runs it)."""
    if address is None:
        return False
    name = socket.gethostname()
    if address.host in (name, socket.getfqdn()):
        return True
    try:
        return socket.gethostbyname(address.host) == socket.gethostbyname(name)
    except OSError:
        return False
