"""Two hosts on one machine, for the multi-host tests: each host is a PID, UTS and mount
namespace of its own (``unshare --pid --fork --mount-proc --uts --mount``) with its own
hostname, a private tmpfs ``/tmp`` (no scratch file is shared between hosts) and a
private ``/etc/hosts`` that gives each hostname its own loopback address (127.0.1.x).
Distinct addresses matter: c10d names a node by its fqdn and pid, and two PID namespaces
give equal pids, so two hosts resolving to one name would wait for each other forever.
The network stays the machine's loopback.

A host runs ``nsadiag run OPTIONS --out /mnt/out/run -- COMMAND`` as root; its run
directory is ``<work>/<host>/run`` outside (bound at /mnt/out inside, before /tmp is
covered). A checkout or an interpreter under /tmp (a clone in /tmp, its .venv) is bound
back at its own path over the private /tmp, so the host runs the same code
(``_kept_under_tmp``); ``while_hosts_live`` fails a wait at once when a host has ended.
``kill_host`` kills a host outright: its namespace's first process, and with it every
process of the namespace.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import REPO

UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc", "--uts", "--mount", "--kill-child")
INSIDE_OUT = "/mnt/out"


def unshare_refused() -> str | None:
    """Why two hosts cannot be made here (one line), None when they can."""
    if shutil.which("unshare") is None:
        return "needs util-linux unshare"
    if os.geteuid() != 0:
        return "needs root for PID, UTS and mount namespaces (unshare)"
    try:
        done = subprocess.run([*UNSHARE, "sh", "-c", "hostname probe && mount -t tmpfs "
                               "none /mnt"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unshare refused: {err}"
    if done.returncode != 0:
        return f"unshare refused: {done.stderr.strip().splitlines()[-1:]}"
    return None


def free_port(address: str) -> int:
    """A TCP port free on ``address`` now."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


@dataclass
class Host:
    """One host: its name, loopback address, outside work directory, and its namespace's
    process (``unshare``; None before it starts)."""

    name: str
    address: str
    work: Path
    proc: subprocess.Popen | None = None

    @property
    def run_dir(self) -> Path:
        return self.work / "run"

    def communicate(self, timeout: float) -> tuple[int, str, str]:
        assert self.proc is not None
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


def make_hosts(root: Path, count: int = 2) -> list[Host]:
    """``count`` hosts host1.. at 127.0.1.1.., with one hosts file naming all of them."""
    hosts = [Host(f"host{i + 1}", f"127.0.1.{i + 1}", root / f"host{i + 1}")
             for i in range(count)]
    lines = ["127.0.0.1 localhost", *(f"{h.address} {h.name}" for h in hosts)]
    for host in hosts:
        host.work.mkdir(parents=True)
        (host.work / "hosts").write_text("\n".join(lines) + "\n")
    return hosts


def start_host(host: Host, options: list[str], command: list[str],
               env: dict[str, str] | None = None) -> Host:
    """Start ``nsadiag run OPTIONS -- COMMAND`` as ``host`` (see the module docstring)."""
    kept = _kept_under_tmp()
    keep = [f"mkdir -p /mnt/kept/{i} && mount --bind {shlex.quote(p)} /mnt/kept/{i}"
            for i, p in enumerate(kept)]
    restore = [f"mkdir -p {shlex.quote(p)} && mount --bind /mnt/kept/{i} {shlex.quote(p)}"
               for i, p in enumerate(kept)]
    inside = " && ".join([
        "mount --make-rprivate /",
        f"hostname {host.name}",
        f"mount --bind {shlex.quote(str(host.work / 'hosts'))} /etc/hosts",
        "mount -t tmpfs nsadiag-out /mnt", f"mkdir {INSIDE_OUT}",
        f"mount --bind {shlex.quote(str(host.work))} {INSIDE_OUT}",
        *keep,
        "mount -t tmpfs nsadiag-tmp /tmp",
        *restore,
        "exec " + shlex.join([sys.executable, "-m", "nsadiag.cli", "run", *options,
                              "--out", f"{INSIDE_OUT}/run", "--", *command])])
    host.proc = subprocess.Popen([*UNSHARE, "sh", "-c", inside], cwd=REPO,
                                 env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    return host


def _kept_under_tmp() -> list[str]:
    """The checkout and the interpreter's environment when they lie under /tmp (which each
    host covers with its own): the outermost of them, each once."""
    paths = sorted({str(Path(p).resolve()) for p in (REPO, sys.prefix, sys.base_prefix)
                    if Path(p).resolve().is_relative_to("/tmp")})
    return [p for p in paths if not any(p != q and Path(p).is_relative_to(q) for q in paths)]


def while_hosts_live(hosts: list[Host], condition: Any) -> Any:
    """``condition`` for tests.procs.wait_for that raises at once, with the host's own
    error, when a host's namespace ended before the condition held (a host that cannot
    start fails its test now, not at the deadline)."""

    def check() -> Any:
        found = condition()
        if found:
            return found
        for host in hosts:
            if host.proc is not None and host.proc.poll() is not None:
                _, err = host.proc.communicate()
                raise AssertionError(f"{host.name} ended with code {host.proc.returncode} "
                                     f"before that: {err[-2000:]}")
        return found
    return check


def kill_host(host: Host) -> None:
    """Kill the host outright: ``unshare --kill-child`` sends SIGKILL to the namespace's
    first process when it dies, and the kernel then kills every process of the
    namespace."""
    assert host.proc is not None
    host.proc.send_signal(signal.SIGKILL)


def torchrun(script: Path, store: Host, port: int, *args: str, nnodes: int = 2,
             nproc: int = 2) -> list[str]:
    """The torchrun command line of a c10d-rendezvous job whose store is on ``store``."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc_per_node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"{store.name}:{port}", "--rdzv-id", "twohosts", str(script), *args]
