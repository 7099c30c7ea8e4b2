"""Starting a diagnosis's processes so that none of them outlives it.

``Launched(argv, env, stdout, stderr)`` starts a command (a trial child, torchrun, a user's
own script) in a session of its own; ``kill_all()`` ends every process it started, which
every path out of a diagnosis calls (a verdict, an exception, Ctrl-C, SIGTERM).

What "every process it started" means, and how each is found:

- The job's token. Every launched command gets ``NSADIAG_OWNER=<token>`` in its environment
  (a token per job: the owner's pid and 16 random hex digits). Every descendant inherits
  it, including those that leave the session or the process group (``os.setsid()``,
  ``start_new_session=True``, a double fork whose middle process exits and leaves the
  grandchild to init): ``/proc/PID/environ`` holds the environment a process was started
  with, so ``token_carriers`` finds them wherever they were re-parented.
- The tree. Every poll records the launcher's descendants (pid and start time), so a
  descendant that rebuilt its environment from nothing is still known if it was seen
  once while attached to the tree.
- Adoption. The nsadiag command makes itself the subreaper of what it starts
  (``adopt_orphans``: ``prctl(PR_SET_CHILD_SUBREAPER)`` on Linux, from its first job on,
  once its reaper has detached), so a process of a job whose parent exits (the middle
  process of a double fork) is re-parented to nsadiag, not to init. Such an adopted
  process is found as a child of nsadiag that nsadiag did not start (``adopted``: not a
  launcher, not in nsadiag's own session or its reaper's), however it changed its
  environment and session, and it ends with the job; its pid also goes to the reaper,
  which then ends it if nsadiag dies.

``kill_all`` freezes (SIGSTOP) every process found, looks again until no new one appears
(a frozen process cannot start another), then SIGKILLs them all and waits: no process can
respawn a sibling between the look and the kill.

If nsadiag itself dies (``kill -9`` included) a reaper does the same: one small process
per nsadiag process (nsadiag.harness.reaper), in a session of its own so a signal to
nsadiag's process group does not reach it, holding the read end of a pipe whose only write
end is in nsadiag. nsadiag writes each job's token and launcher pid into the pipe before
the job can start anything; the reaper records the launcher's descendants every 0.2 s;
when the pipe reports end of file (nsadiag is gone, however it ended) it freezes and kills
every process carrying a token and every recorded process still alive (same pid and start
time), until a look finds none, and exits. On a normal exit of nsadiag it finds nothing to
kill.

Where the machine lets nsadiag make a cgroup (v2, with ``cgroup.kill``), every job also
runs in one of its own (nsadiag.harness.cgroup): ``kill_all`` and the reaper first kill
the whole group at once, which no fork, exit of a parent, setsid() or stripped
environment escapes. Elsewhere the containment above is best effort
(``Launched.containment`` says which, and why).

Not found by any (without a cgroup): in a process that did not call ``adopt_orphans`` (a
library caller's own program), a descendant that removed NSADIAG_OWNER from its
environment and left the tree within one poll (0.2 s) of its start.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from nsadiag.harness.cgroup import JobGroup, why_not
from nsadiag.harness.helpers import failure_line, helper_popen

OWNER_ENV = "NSADIAG_OWNER"
FREEZE_ROUNDS = 20
WAIT_S = 10.0
PR_SET_CHILD_SUBREAPER = 36
_launchers: set[int] = set()  # pids of the live launched commands of this process
_adopt = False  # adopt_orphans() was called
_adopting = False  # and this process is a subreaper now


def adopt_orphans() -> None:
    """Make this process the subreaper of its descendants (Linux) from its first job on: a
    descendant whose parent exits is re-parented here rather than to init, where
    ``adopted`` finds it. Meant for a program that is nsadiag itself (the command line),
    since it changes where every orphan of the process's descendants goes. It takes effect
    once the reaper runs, so that the reaper, which detaches itself, is no child of it."""
    global _adopt
    _adopt = True


def _become_subreaper() -> None:
    global _adopting
    if not _adopt or _adopting:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _adopting = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _adopting = False


def adopted(since: float) -> list[psutil.Process]:
    """The live processes this subreaper adopted since ``since`` (a create time): its
    children that it did not start itself (not a launcher, not in its own session or its
    reaper's). Adopted processes that have already ended are reaped. Empty unless
    ``adopt_orphans`` took effect."""
    if not _adopting:
        return []
    found = []
    own = {os.getsid(0), *_REAPER.sessions}
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return []
    for child in children:
        try:
            if child.pid in _launchers or os.getsid(child.pid) in own or \
                    child.create_time() < since - 1.0:
                continue
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)  # no Popen waits for it: nsadiag does
                continue
        except (psutil.Error, OSError):
            continue
        found.append(child)
    return found


def new_token() -> str:
    """A token naming one job: this process's pid and 16 random hex digits."""
    return f"{os.getpid()}-{secrets.token_hex(8)}"


def token_carriers(tokens: set[str] | list[str]) -> list[int]:
    """Pids of the live processes whose environment holds NSADIAG_OWNER=<one of tokens>
    (this process excluded). Zombies have no environment and are not listed."""
    wanted = set(tokens)
    if not wanted:
        return []
    found = []
    me = os.getpid()
    for process in psutil.process_iter():
        if process.pid == me:
            continue
        try:
            if process.environ().get(OWNER_ENV) in wanted:
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def alive(process: psutil.Process) -> bool:
    """True while the process runs (a zombie has ended: it only waits to be reaped)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def freeze_and_kill(found: Callable[[], list[psutil.Process]]) -> list[psutil.Process]:
    """Freeze, look again, then kill: ``found()`` returns the processes to end now (it is
    called until it returns no process not already frozen); each is SIGSTOPped as it is
    found, then all are SIGKILLed. Returns the processes signalled."""
    frozen: dict[int, psutil.Process] = {}
    for _ in range(FREEZE_ROUNDS):
        new = [p for p in found() if p.pid not in frozen and p.pid != os.getpid()]
        if not new:
            break
        for process in new:
            try:
                process.send_signal(signal.SIGSTOP)
            except psutil.Error:
                continue
            frozen[process.pid] = process
    for process in frozen.values():
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.Error:
            continue
    return list(frozen.values())


def wait_gone(processes: list[psutil.Process], timeout_s: float = WAIT_S) -> list[psutil.Process]:
    """Wait until every process has ended (zombies count as ended; our own children are
    reaped); returns those still running at the timeout."""
    deadline = time.monotonic() + timeout_s
    left = list(processes)
    while left and time.monotonic() < deadline:
        for process in left:
            try:
                if process.ppid() == os.getpid():
                    os.waitpid(process.pid, os.WNOHANG)
            except (psutil.Error, ChildProcessError, OSError):
                pass
        left = [p for p in left if alive(p)]
        if left:
            time.sleep(0.05)
    return left


class _Reaper:
    """This process's reaper (see the module docstring): started on first use, started
    again if it is gone. It detaches itself (nsadiag.harness.reaper forks and its first
    process exits), so it is no child of nsadiag: a diagnosis leaves nsadiag with no child
    process, and the reaper's liveness shows as the pipe accepting writes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.write_fd: int | None = None
        self.sessions: set[int] = set()  # the reapers' sessions (each its first pid)

    def tell(self, line: str) -> None:
        """Send one line to the reaper, starting it first when needed."""
        data = (line + "\n").encode()
        with self.lock:
            if self.write_fd is not None:
                try:
                    os.write(self.write_fd, data)
                    return
                except OSError:  # EPIPE: the reaper is gone
                    os.close(self.write_fd)
                    self.write_fd = None
            self._start()
            os.write(self.write_fd, data)

    def _start(self) -> None:
        read_fd, write_fd = os.pipe()  # not inheritable: no child but the reaper holds it
        # the reaper of a nested nsadiag is not one of its jobs; it runs away from the
        # user's directory (nsadiag.harness.helpers)
        started = helper_popen("nsadiag.harness.reaper", str(os.getpid()), drop=(OWNER_ENV,))
        try:
            with tempfile.TemporaryFile() as log:
                first = subprocess.Popen(**started, stdin=read_fd, stdout=subprocess.DEVNULL,
                                         stderr=log, start_new_session=True)
                self.sessions.add(first.pid)  # a subreaper adopts the reaper: not a job's
                code = first.wait(timeout=60)  # it exits as soon as the detached one runs
                if code != 0:
                    log.seek(0)
                    os.close(write_fd)
                    raise ValueError(f"nsadiag's reaper (the helper that ends what a "
                                     f"command leaves behind) did not start: "
                                     f"{failure_line(log.read(), code)}")
        finally:
            os.close(read_fd)
        self.write_fd = write_fd


_REAPER = _Reaper()


class Launched:
    """A command in a session of its own, and every process it started (see the module
    docstring). ``stdout`` and ``stderr`` are what subprocess.Popen takes (a file, PIPE)."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: Any = None,
                 stderr: Any = None):
        self.token = new_token()
        _REAPER.tell(f"token {self.token}")  # known to the reaper before anything starts
        _become_subreaper()
        self.group = JobGroup.make(self.token)
        self.containment: dict[str, Any] = {"cgroup": self.group is not None,
                                            "why_not": why_not()}
        if self.group is not None:  # its name, so a check can tell it was removed
            self.containment["group"] = self.group.path.name
        if self.group is not None:
            _REAPER.tell(f"cgroup {self.group.path}")
        self.started = time.time()
        try:
            self.proc = subprocess.Popen(argv, stdout=stdout, stderr=stderr,
                                         env={**env, OWNER_ENV: self.token},
                                         start_new_session=True,
                                         preexec_fn=self.group.entering() if self.group
                                         else None)
        except BaseException:
            if self.group is not None:
                self.group.remove()
            raise
        self.pid = self.proc.pid
        _launchers.add(self.pid)
        _REAPER.tell(f"tree {self.pid}")
        self.seen: dict[int, psutil.Process] = {}
        try:
            self.seen[self.pid] = psutil.Process(self.pid)
        except psutil.Error:
            pass

    def poll(self) -> int | None:
        self.scan()
        return self.proc.poll()

    def scan(self) -> None:
        """Remember every descendant now alive (torchrun's ranks leave its session) and
        every process adopted since the job started (told to the reaper too)."""
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.Error:
            pass
        for orphan in adopted(self.started):
            if orphan.pid not in self.seen:
                self.seen[orphan.pid] = orphan
                _REAPER.tell(f"tree {orphan.pid}")

    def members(self) -> list[psutil.Process]:
        """Every live process of the job now: seen in the tree, or carrying its token."""
        self.scan()
        members = {p.pid: p for p in self.seen.values() if alive(p)}
        for pid in token_carriers([self.token]):
            if pid not in members:
                try:
                    members[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
        return [p for p in members.values() if alive(p)]

    def kill_all(self) -> list[int]:
        """SIGKILL every process of the job (frozen first, see the module docstring) and
        wait for them; returns the pids of those that were still running."""
        def found() -> list[psutil.Process]:
            members = self.members()
            for process in list(members):
                try:
                    members += process.children(recursive=True)
                except psutil.Error:
                    continue
            return members

        if self.group is not None:
            self.group.kill()  # all at once, however fast they fork
        signalled = freeze_and_kill(found)
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        _launchers.discard(self.pid)
        wait_gone(signalled)
        if self.group is not None:
            self.group.remove()
        _REAPER.tell(f"done {self.token}")
        return [p.pid for p in signalled]
