"""The memory limit a command runs under, and whether the kernel's OOM killer acted there.

A job in a container, a Slurm step or a systemd unit runs in a memory cgroup with a
limit; at the limit the kernel kills the largest process with SIGKILL, and the one trace
of why is the cgroup's count of OOM kills (and the kernel log, which a container rarely
may read). ``memory_limit()`` reads, for this process's own memory cgroup and each of its
ancestors up to the mount, the limit (cgroup v2 ``memory.max``, v1
``memory.limit_in_bytes``; the smallest one applies) and the OOM kills counted
(v2 ``memory.events`` ``oom_kill``, hierarchical; v1 ``memory.oom_control``
``oom_kill``, each cgroup its own, summed up the chain). Read before and after a run:
more kills after, and the command's first process dead of SIGKILL, is the OOM killer's
work. None when this machine has no memory cgroup that can be read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
OWN_CGROUP = Path("/proc/self/cgroup")
NO_LIMIT = 2**62  # v1 writes "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True)
class MemoryLimit:
    """The smallest memory limit up the cgroup chain (None: unlimited), the OOM kills
    counted along it, and the cgroup read (its path under the mount)."""

    cap_bytes: int | None
    oom_kills: int
    cgroup: str


def _mounts() -> list[tuple[str, Path, str]]:
    """(fstype, mount point, root) of the cgroup mounts: cgroup2, and a v1 mount with the
    memory controller."""
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, rest = before.split(" "), after.split(" ")
        if len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2" or (rest[0] == "cgroup" and "memory" in rest[2].split(",")):
            found.append((rest[0], Path(fields[4]), fields[3]))
    return found


def _own_paths() -> dict[str, str]:
    """{"v2": path, "v1": path} of this process's cgroups."""
    paths = {}
    try:
        for line in OWN_CGROUP.read_text().splitlines():
            number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
            if number == "0" and controllers == "":
                paths["v2"] = path
            elif "memory" in controllers.split(","):
                paths["v1"] = path
    except OSError:
        return {}
    return paths


def _directory(mount: Path, root: str, own: str) -> Path | None:
    """Where ``own`` (a path as /proc/self/cgroup gives it) is under the mount: relative to
    the mount's root; inside a container whose namespace hides the prefix, the mount
    itself holds the process's cgroup at a shorter path."""
    relative = own[len(root):] if root != "/" and own.startswith(root) else own
    candidate = mount / relative.lstrip("/")
    if candidate.is_dir():
        return candidate
    return mount if mount.is_dir() else None


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _counter(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _chain(directory: Path, mount: Path) -> list[Path]:
    chain = [directory]
    while chain[-1] != mount and mount in chain[-1].parents:
        chain.append(chain[-1].parent)
    return chain


def memory_limit() -> MemoryLimit | None:
    """This process's memory limit and OOM kills (see the module docstring)."""
    own = _own_paths()
    for fstype, mount, root in _mounts():
        version = "v2" if fstype == "cgroup2" else "v1"
        if version not in own:
            continue
        directory = _directory(mount, root, own[version])
        if directory is None:
            continue
        caps: list[int] = []
        kills = 0
        readable = False
        for cgroup in _chain(directory, mount):
            limit = _read(cgroup / ("memory.max" if version == "v2" else
                                    "memory.limit_in_bytes"))
            if limit is not None:
                readable = True
                value = _number(limit)
                if value is not None and value < NO_LIMIT:
                    caps.append(value)
            if version == "v2":
                if cgroup == directory:  # memory.events counts the subtree's kills
                    kills = _counter(_read(cgroup / "memory.events"), "oom_kill")
            else:
                kills += _counter(_read(cgroup / "memory.oom_control"), "oom_kill")
        if readable:
            return MemoryLimit(min(caps) if caps else None, kills,
                               "/" + str(directory.relative_to(mount)).lstrip("."))
    return None


def killed_by_oom(before: MemoryLimit | None, after: MemoryLimit | None) -> bool:
    """Whether the OOM killer acted in this process's cgroups between the two readings."""
    return before is not None and after is not None and after.oom_kills > before.oom_kills
