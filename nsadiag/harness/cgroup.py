"""A job's own cgroup (v2), where this machine lets nsadiag make one: the containment no
process of the job can leave by forking, exiting its parent, setsid() or dropping its
environment.

``JobGroup.make(token)`` creates ``nsadiag-<token>`` under this process's own cgroup on
the cgroup2 mount (None when there is no writable cgroup2 hierarchy, or it has no
``cgroup.kill``: then containment is the token, tree and adoption of
nsadiag.harness.launch alone, best effort, and ``why_not()`` says why). ``kill()``
writes ``cgroup.kill``: the kernel SIGKILLs every process in the group at once, a
process forking every few milliseconds included; ``remove()`` removes the emptied group.
The reaper does the same when nsadiag dies.

The launcher enters the group in the child, between fork and exec (``entering``: one
write of "0" to ``cgroup.procs``, nothing that takes a lock), so every process the
command starts is born inside, and a command that cannot be executed still fails as
subprocess reports it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
OWN_CGROUP = Path("/proc/self/cgroup")
EMPTY_WAIT_S = 5.0
_why_not: list[str] = []


def _cgroup2_root() -> Path | None:
    """Where the cgroup2 hierarchy is mounted (the unified mount of a hybrid setup too)."""
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        before, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] == "cgroup2":
            return Path(before.split(" ")[4])
    return None


def _own_path() -> str | None:
    """This process's cgroup in the v2 hierarchy ("0::/path")."""
    try:
        for line in OWN_CGROUP.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        return None
    return None


def why_not() -> str | None:
    """Why the last ``JobGroup.make`` made no group (None when it made one)."""
    return _why_not[-1] if _why_not else None


class JobGroup:
    """One job's cgroup (see the module docstring)."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def make(cls, token: str) -> JobGroup | None:
        root, own = _cgroup2_root(), _own_path()
        _why_not.clear()
        if root is None or own is None:
            _why_not.append("this machine has no cgroup v2 hierarchy")
            return None
        parent = root / own.lstrip("/")
        path = parent / f"nsadiag-{token}"
        try:
            path.mkdir()
        except OSError as err:
            _why_not.append(f"no cgroup can be made in {parent}: {err.strerror or err}")
            return None
        if not (path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                path.rmdir()
            _why_not.append("the cgroup v2 hierarchy has no cgroup.kill (Linux 5.14+)")
            return None
        return cls(path)

    def entering(self) -> Callable[[], None]:
        """What the child runs before exec to move itself into the group (a preexec_fn);
        should the move fail the command runs all the same, outside the group (``holds``
        then says so)."""
        procs = os.fsencode(self.path / "cgroup.procs")

        def enter() -> None:
            try:
                fd = os.open(procs, os.O_WRONLY)
            except OSError:
                return
            try:
                os.write(fd, b"0")
            except OSError:
                pass
            finally:
                os.close(fd)
        return enter

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def holds(self, pid: int) -> bool:
        return pid in self.pids()

    def kill(self) -> None:
        """SIGKILL every process in the group at once (the kernel's cgroup.kill)."""
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")

    def remove(self) -> None:
        """Remove the group once it is empty (its processes killed): waits a little for
        the kernel to let the last of them go."""
        end = time.monotonic() + EMPTY_WAIT_S
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > end:
                    return
                time.sleep(0.05)
