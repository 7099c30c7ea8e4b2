"""The names of one rank: host, global rank, local rank, node rank.

Read once, at the edge, from the environment a launcher gives each rank: torchrun's RANK,
LOCAL_RANK, GROUP_RANK (its node rank; NODE_RANK where a launcher sets that instead),
WORLD_SIZE and LOCAL_WORLD_SIZE; under ``srun`` without torchrun, SLURM_PROCID,
SLURM_LOCALID and SLURM_NODEID; the host is this machine's name (SLURMD_NODENAME where
Slurm gives it: the name the scheduler knows the node by).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")


@dataclass(frozen=True)
class RankNames:
    """Where one process stands in a job; a field is None when no launcher said."""

    host: str
    rank: int | None = None
    local_rank: int | None = None
    node_rank: int | None = None
    world_size: int | None = None
    slurm_job: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankNames:
        return cls(host=str(data.get("host") or "?"), rank=_int(data.get("rank")),
                   local_rank=_int(data.get("local_rank")),
                   node_rank=_int(data.get("node_rank")),
                   world_size=_int(data.get("world_size")),
                   slurm_job=data.get("slurm_job"))

    def label(self) -> str:
        """"rank 3 on host2 (local rank 1, node 1)"; the parts known."""
        inner = [f"local rank {self.local_rank}" if self.local_rank is not None else None,
                 f"node {self.node_rank}" if self.node_rank is not None else None]
        said = ", ".join(part for part in inner if part)
        rank = f"rank {self.rank}" if self.rank is not None else "a process"
        return f"{rank} on {self.host}" + (f" ({said})" if said else "")


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _first(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        found = _int(env.get(name))
        if found is not None:
            return found
    return None


def rank_names(env: Mapping[str, str], hostname: str | None = None) -> RankNames:
    """This process's names from its environment (see the module docstring)."""
    host = env.get("SLURMD_NODENAME") or hostname or socket.gethostname()
    return RankNames(host=host, rank=_first(env, "RANK", "SLURM_PROCID"),
                     local_rank=_first(env, "LOCAL_RANK", "SLURM_LOCALID"),
                     node_rank=_first(env, "GROUP_RANK", "NODE_RANK", "SLURM_NODEID"),
                     world_size=_first(env, "WORLD_SIZE", "SLURM_NTASKS"),
                     slurm_job=env.get("SLURM_JOB_ID") or None)


def process_environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    """The environment another process started with (/proc/PID/environ: NUL-separated
    NAME=VALUE), {} when it cannot be read (gone, or not ours to read)."""
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, sep, value in pairs if sep and name}


def process_names(pid: int, proc: Path = PROC, hostname: str | None = None) -> RankNames:
    """The names of another process of this machine (``nsadiag attach --ranks``), from the
    environment its launcher gave it (see the module docstring): a name its environment
    does not give, or an environment that cannot be read, is None."""
    return rank_names(process_environ(pid, proc), hostname)
