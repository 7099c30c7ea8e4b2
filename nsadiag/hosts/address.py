"""Where the job's store is, read once from the command line and the environment.

torchrun with c10d rendezvous hosts a TCPStore at ``--rdzv-endpoint`` (``--rdzv_endpoint``)
in one host's agent, not in a trainer, so a wedged rank 0 does not take it down: that is
the first choice. Without one, ``--master-addr``/``--master-port`` of torchrun, else
MASTER_ADDR and MASTER_PORT of the environment (a plain ``torch.distributed`` job with
env://: rank 0 hosts that store). Without either each host keeps its own view.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RDZV_DEFAULT_PORT = 29400
"""torchrun's port for an endpoint given without one (torch.distributed.elastic)."""
TORCHRUN = ("torchrun", "torch.distributed.run", "torch/distributed/run.py")


@dataclass(frozen=True)
class StoreAddress:
    """A store to meet in: ``host:port``, and ``source`` (which of the above it came from,
    in words for the report)."""

    host: str
    port: int
    source: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class JobShape:
    """What the command says of the job: its store (None: per-host views) and how many
    hosts take part (torchrun's --nnodes, its maximum; None when it does not say)."""

    store: StoreAddress | None
    nnodes: int | None


def _options(argv: Sequence[str]) -> dict[str, str]:
    """torchrun's ``--name value`` / ``--name=value`` options up to the script, with
    dashes and underscores alike."""
    found: dict[str, str] = {}
    words = list(argv)
    start = next((i + 1 for i, word in enumerate(words)
                  if any(word.endswith(name) for name in TORCHRUN)), None)
    if start is None:
        return found
    i = start
    while i < len(words) and words[i].startswith("-"):
        name, has_value, value = words[i].lstrip("-").partition("=")
        name = name.replace("_", "-")
        if has_value:
            found[name] = value
        elif i + 1 < len(words) and not words[i + 1].startswith("-"):
            found[name] = words[i + 1]
            i += 1
        else:
            found[name] = ""
        i += 1
    return found


def _endpoint(text: str, default_port: int) -> tuple[str, int]:
    """("host", port) of "host:port", "host" or "[v6]:port"; ValueError when the port is no
    number."""
    host, colon, port = text.rpartition(":")
    if not colon or "]" in port:
        return text.strip("[]"), default_port
    return host.strip("[]"), int(port)


def job_shape(argv: Sequence[str], env: Mapping[str, str]) -> JobShape:
    """The job's store and host count from the command ``argv`` and environment ``env``."""
    options = _options(argv)
    nnodes = None
    if options.get("nnodes"):
        last = options["nnodes"].rpartition(":")[2]
        nnodes = int(last) if last.isdigit() else None
    store = None
    endpoint = options.get("rdzv-endpoint")
    if endpoint and options.get("rdzv-backend", "static") == "c10d":
        try:
            host, port = _endpoint(endpoint, RDZV_DEFAULT_PORT)
            store = StoreAddress(host, port, "torchrun's c10d rendezvous store "
                                             "(--rdzv-endpoint)")
        except ValueError:
            store = None
    if store is None and options.get("master-addr") and options.get("master-port", "").isdigit():
        store = StoreAddress(options["master-addr"], int(options["master-port"]),
                             "torchrun's --master-addr:--master-port store")
    if store is None and env.get("MASTER_ADDR") and env.get("MASTER_PORT", "").isdigit():
        store = StoreAddress(env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                             "the MASTER_ADDR:MASTER_PORT store")
    return JobShape(store, nnodes)
