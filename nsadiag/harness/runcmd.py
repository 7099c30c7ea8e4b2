"""`nsadiag run -- CMD`: the user's own command, unchanged, watched to a verdict.

``run_command(argv, run_dir, stall_timeout_s, deadline_s)`` starts the command in a
session of its own with ``nsadiag/harness/inject`` (the sitecustomize hook alone) first
on PYTHONPATH and NSADIAG_RUN_DIR set, so every Python process it starts (``python
train.py``, ``python -m pkg``, torchrun and each of its ranks) writes its own heartbeat
into ``<run_dir>/proc-<pid>/`` (nsadiag.harness.watched). The command's stdout and stderr
pass through to nsadiag's own (through a pseudo-terminal when that is a terminal, so the
command sees one, as it would without nsadiag) and are kept in ``stdout.txt`` and
``stderr.txt``; ``run.json`` names the command. The copies never hold the command up: its
output is always drained, into the files first, and shown on the terminal from a bounded
buffer by a thread of its own (nsadiag.harness.echo), so a terminal that stops reading
(Ctrl-S, a pipe nobody reads) delays or drops what is shown (how much is kept in the
evidence, ``output_not_shown``), and a disk that fills stops the copies (where and why:
``output_copies``), never the command; the verdict is still written (nsadiag.rundir's
reserve). On a terminal, ``live`` keeps a status line below the output. Every process's
private and shared memory is read while it runs (nsadiag.harness.procmem), for the
workers that copy what they were forked with and the process that grows.

The one parent loop (nsadiag.harness.session) follows every process's stream as it
appears, with the stall clock on progress of any of them. On a stall every watched
process, and every other live Python process of the command's tree (a DataLoader worker
forked without the injected hook, a launcher: nsadiag.harness.tree), is sampled at once
(nsadiag.harness.capture) before the whole tree is killed
(every process it started, those that left its session included: nsadiag.harness.launch);
at ``deadline_s`` (the user's own job timeout) a progressing run is SLOW with its rate and
time per step, never a hang because a timer fired. A command that exits by itself gets
OK for exit code 0, else the verdict of the exception a process recorded (or the last
traceback on its stderr), else the exit code's verdict; a first process dead of SIGKILL
while the OOM kills of nsadiag's memory cgroup rose is OOM (nsadiag.harness.memlimit).
A run the user interrupts (Ctrl-C, SIGTERM, SIGHUP) is recorded too, with what was known then
(nsadiag.harness.interrupted); ``record.evidence.interrupted`` says so.

The record (nsadiag.harness.record) names the training process (the one with the most
heartbeat events) and the evidence of every process. A torchrun job of two or more ranks
is decided across ranks, as a `nsadiag ddp` trial is (nsadiag.verdict.ranks): the
collectives each rank issued (counted in every process, DDP's buckets included), where
each rank waits, and which rank left the common path.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import re
import shutil
import sys
import termios
import threading
import time
from pathlib import Path
from typing import IO, Any

import psutil

from nsadiag.evidence import StallEvidence
from nsadiag.harness.capture import unwatched
from nsadiag.harness.echo import Echo, LiveStatus
from nsadiag.harness.interrupted import interrupted_verdict
from nsadiag.harness.launch import Launched
from nsadiag.harness.memlimit import killed_by_oom, memory_limit
from nsadiag.harness.procmem import MemoryWatch
from nsadiag.harness.record import (
    build_record,
    command_facts,
    outcome_of,
    rank_evidence,
    rank_streams,
    stream_result,
    training_stream,
)
from nsadiag.harness.session import Interrupted, Tree, watch_session
from nsadiag.harness.streams import UNBOUNDED_STEPS, Due, Stream
from nsadiag.harness.times import CAPTURE_WINDOW_MIN_S, WatchTimes
from nsadiag.hosts.address import job_shape
from nsadiag.hosts.merged import HostsView
from nsadiag.hosts.shared import SharedView
from nsadiag.hosts.trace import hosts_trace
from nsadiag.ranknames import rank_names
from nsadiag.rundir import TrialRecord, create_file, prepare_run_dir, read_tail, write_json
from nsadiag.verdict.ranks import RankEvidence
from nsadiag.verdict.straggler import hot_frame

INJECT = Path(__file__).resolve().parent / "inject"
STDERR_TAIL_BYTES = 1 << 20  # where the last traceback is looked for
HOSTS_TRACE = "hosts-trace.json"


def command_env(run_dir: Path) -> dict[str, str]:
    """This environment, with the directory of the injected sitecustomize (it holds
    nothing else, and the hook takes it off ``sys.path`` again) first on PYTHONPATH and
    the run directory named. Nothing of nsa-diag's own is put on the path: the command
    imports the packages it would import without nsadiag (nsadiag.harness.inject)."""
    path = [str(INJECT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                            if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path),
            "NSADIAG_RUN_DIR": str(run_dir.resolve()), "PYTHONUNBUFFERED": "1"}


KEPT_HEAD_BYTES = 16 * 2**20
KEPT_TAIL_BYTES = 16 * 2**20
"""The copy of a command's output keeps its first and its last 16 MiB (the start-up and
the end, where a traceback is); what lies between is counted, not kept, so a program that
prints for days cannot fill the disk with nsadiag's copy (the terminal shows it all)."""


class _Tee(threading.Thread):
    """Copies one output of the command (a pipe, or a pseudo-terminal's master side) to a
    file and on to the terminal (``echo``), as it comes, and drains it to its end whatever
    happens to either: the file first, and the terminal's share is handed to the echo,
    which never blocks (nsadiag.harness.echo), so a terminal that stops reading never
    holds the command up. A file that cannot be written (a full disk) ends the copy, and
    ``lost`` says where. Past KEPT_HEAD_BYTES the output is held in memory, its last
    KEPT_TAIL_BYTES only, and written after a line saying how much was left out when the
    output ends (``cut`` says so too)."""

    def __init__(self, fd: int, echo: Echo, index: int, path: Path):
        super().__init__(daemon=True)
        self.fd, self.echo, self.index, self.path = fd, echo, index, path
        self.copied = 0
        self.lost: str | None = None
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_bytes = 0
        self.dropped = 0  # bytes between the head and the tail, not kept
        self.cut: str | None = None

    def run(self) -> None:
        kept = self._open()
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: no process holds the pseudo-terminal any more
                break
            if not chunk:
                break
            if kept is not None:
                kept = self._keep(kept, chunk)
            self.echo.offer(self.index, chunk)
        if kept is not None:
            kept = self._write_tail(kept)
        if kept is not None:
            with contextlib.suppress(OSError):
                kept.close()
        os.close(self.fd)

    def _keep_head(self, kept: IO[bytes], chunk: bytes) -> IO[bytes] | None:
        room = KEPT_HEAD_BYTES - self.copied
        if room > 0:
            kept = self._write(kept, chunk[:room])
            chunk = chunk[room:]
        if chunk and kept is not None:
            self.tail.append(chunk)
            self.tail_bytes += len(chunk)
            while self.tail_bytes > KEPT_TAIL_BYTES:  # exactly the last KEPT_TAIL_BYTES
                first, excess = self.tail.popleft(), self.tail_bytes - KEPT_TAIL_BYTES
                if len(first) > excess:
                    self.tail.appendleft(first[excess:])
                cut = min(len(first), excess)
                self.tail_bytes -= cut
                self.dropped += cut
        return kept

    def _write_tail(self, kept: IO[bytes]) -> IO[bytes] | None:
        """The output ended: the line for what was left out, then the tail."""
        if self.dropped:
            total = self.copied + self.dropped + self.tail_bytes
            self.cut = (f"{self.path.name}: the output was {total:,} bytes; its first and "
                        f"last {KEPT_HEAD_BYTES // 2**20} MiB are kept, the {self.dropped:,} "
                        f"bytes between them left out (passed on to nsadiag's own output "
                        f"as they came)")
            kept = self._write(kept, f"\n[nsadiag: {self.dropped} bytes of the output left "
                                     f"out here]\n".encode())
        tail, self.tail = b"".join(self.tail), collections.deque()
        return self._write(kept, tail) if kept is not None and tail else kept

    def _open(self) -> IO[bytes] | None:
        try:
            return create_file(self.path)
        except OSError as err:
            self.lost = f"{self.path.name}: not kept ({err.strerror or err})"
            return None

    def _keep(self, kept: IO[bytes], chunk: bytes) -> IO[bytes] | None:
        """Take a chunk into the copy (the head, or the tail held in memory); None once the
        copy has stopped."""
        if self.copied + len(chunk) <= KEPT_HEAD_BYTES and not self.tail:
            return self._write(kept, chunk)
        return self._keep_head(kept, chunk)

    def _write(self, kept: IO[bytes], chunk: bytes) -> IO[bytes] | None:
        """Append to the file; None once the copy has stopped."""
        try:
            view = memoryview(chunk)
            while view:
                written = kept.write(view)
                self.copied += written
                view = view[written:]
            return kept
        except OSError as err:
            self.lost = (f"{self.path.name}: the copy stopped after {self.copied} bytes "
                         f"({err.strerror or err}); the output went on to the terminal")
            with contextlib.suppress(OSError):
                kept.close()
            return None


def _output_for(terminal: IO[str]) -> tuple[int, int]:
    """(read end, write end) for one output of the command: a pseudo-terminal of the same
    size when nsadiag's own output is a terminal (the command sees a terminal, as it would
    without nsadiag: colours, progress bars, line buffering), else a pipe. The terminal
    turns no newline into CR LF, so the kept copy is the bytes the command wrote."""
    try:
        size = fcntl.ioctl(terminal.fileno(), termios.TIOCGWINSZ, bytes(8)) \
            if terminal.isatty() else None
    except (OSError, ValueError):
        size = None
    if size is None:
        return os.pipe()
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    attributes = termios.tcgetattr(slave)
    attributes[1] &= ~termios.ONLCR
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    return master, slave


def _fd_of(stream: IO[str], default: int) -> int:
    """The file descriptor under ``stream`` (the process's own ``default`` when it has none:
    a stand-in a test put there)."""
    try:
        return stream.fileno()
    except (OSError, ValueError, AttributeError):
        return default


class _Command(Launched):
    """The user's command with its output kept and shown (nsadiag.harness.echo)."""

    def __init__(self, argv: list[str], env: dict[str, str], run_dir: Path,
                 live: LiveStatus | None = None):
        terminals = (sys.stdout, sys.stderr)
        out, err = _output_for(terminals[0]), _output_for(terminals[1])
        try:
            super().__init__(argv, env, out[1], err[1])
        except BaseException:
            os.close(out[0])
            os.close(err[0])
            raise
        finally:
            os.close(out[1])
            os.close(err[1])
        fds = [_fd_of(terminal, default) for terminal, default in zip(terminals, (1, 2),
                                                                          strict=True)]
        self.echo = Echo(fds, live.line if live is not None else None,
                         fds[1] if live is not None else None)
        self.tees = [_Tee(out[0], self.echo, 0, run_dir / "stdout.txt"),
                     _Tee(err[0], self.echo, 1, run_dir / "stderr.txt")]
        for tee in self.tees:
            tee.start()

    def finish(self) -> None:
        for tee in self.tees:
            tee.join(timeout=5)
        self.echo.finish()

    def lost(self) -> list[str]:
        """Why a copy of the output is incomplete, one line per copy (none: both whole): a
        full disk stopped it, or its middle was left out (KEPT_HEAD_BYTES)."""
        return [line for tee in self.tees for line in (tee.lost, tee.cut) if line]

    def not_shown(self) -> dict[str, int]:
        """Bytes of each output the terminal did not show (it did not keep up), by the
        name of the file that keeps them; empty when it showed everything."""
        return {tee.path.name: count for tee, count in zip(self.tees, self.echo.not_shown,
                                                          strict=True) if count}


MEMBERS_SCAN_S = 1.0


class _CommandTree(Tree):
    """A user's command: its processes' streams found as they appear in the run directory,
    its processes that write no heartbeat sampled at a stall, all of them killed at the
    end."""

    def __init__(self, command: _Command, run_dir: Path, shared: SharedView | None = None,
                 capture_window_s: float = 0.0):
        super().__init__([])
        self.command, self.run_dir = command, run_dir
        self.known: set[str] = set()
        self.streams: list[Stream] = []
        self.shared, self.capture_window_s = shared, capture_window_s
        self.memory = MemoryWatch()
        self.scanned: list[psutil.Process] = []
        self.scanned_at = -float("inf")

    def running(self) -> bool:
        return self.command.poll() is None

    def new_streams(self) -> list[Stream]:
        new = []
        for path in sorted(self.run_dir.glob("proc-*/events.jsonl")):
            if path.parent.name not in self.known:
                self.known.add(path.parent.name)
                new.append(Stream(path.parent.name, path, UNBOUNDED_STEPS))
        self.streams += new
        return new

    def ranks(self, stalls: dict[str, StallEvidence] | None = None, ended_ok: bool = False
              ) -> list[RankEvidence]:
        """This host's ranks as they stand (with their capture, at a stall; each ok when
        the command ended well)."""
        return [rank_evidence(rank, stream, stream_result(stream, ended_ok),
                              (stalls or {}).get(stream.name))
                for rank, stream in sorted(rank_streams(self.streams).items())]

    def hot_frames(self) -> dict[int, dict[str, Any]]:
        """Where each rank's sampler saw it most in its latest pulses, for a straggler."""
        found = {rank: hot_frame(list(stream.pulses))
                 for rank, stream in rank_streams(self.streams).items()}
        return {rank: frame for rank, frame in found.items() if frame is not None}

    def wait(self, seconds: float) -> None:
        if self.shared is not None:
            self.shared.tick(self.ranks, self.hot_frames)
        if self.memory.due():
            self.memory.sample(self._members(), watched=self._watched_pids())
        super().wait(seconds)

    def stall_elsewhere(self) -> bool:
        return self.shared is not None and self.shared.stall_elsewhere()

    def _members(self) -> list[psutil.Process]:
        """The job's processes for the memory readings: the tree scanned again once a
        second at most (a scan reads every process's environment), the last scan's list in
        between (a young worker is read twice a second)."""
        now = time.monotonic()
        if now - self.scanned_at >= MEMBERS_SCAN_S:
            self.scanned, self.scanned_at = self.command.members(), now
        return self.scanned

    def _watched_pids(self) -> set[int]:
        return {stream.pid for stream in self.streams if stream.pid}

    def before_capture(self, due: Due) -> None:
        self.memory.sample(self.command.members(), every=True,  # as at the stop
                           watched=self._watched_pids())
        if self.shared is not None and due.reason == "stall" and self.shared.stall is None:
            self.shared.say_stall()

    def capture_ends(self, window_s: float) -> float:
        """The window the hosts share, when there is one: a host that saw the stall later
        ends its capture with the others, but samples for CAPTURE_WINDOW_MIN_S at least
        (and never longer than ``window_s``, whatever the other host's clock says)."""
        ends = super().capture_ends(window_s)
        agreed = self.shared.window_ends(window_s) if self.shared is not None else None
        if agreed is None:
            return ends
        now = time.monotonic()
        return min(ends, max(now + CAPTURE_WINDOW_MIN_S, now + agreed - time.time()))

    def share(self, due: Due, streams: list[Stream], stalls: dict[str, StallEvidence]
              ) -> None:
        if self.shared is not None and due.reason == "stall":
            self.shared.exchange(self.ranks(stalls), self.capture_window_s)

    def unwatched(self, watched: set[int]) -> list[psutil.Process]:
        return unwatched(self.command, watched)

    def stop(self) -> None:
        self.command.kill_all()
        self.command.finish()


def check_command(argv: list[str]) -> str:
    """The program ``argv`` runs (its path), or ValueError (one line) saying why it cannot
    be started: no command, an empty word, not found, a directory, not executable."""
    if not argv:
        raise ValueError("command: give the command to run after --, e.g. "
                         "nsadiag run -- python train.py")
    name = argv[0]
    if not name.strip():
        raise ValueError(f"command: the program to run is an empty word ({name!r}); give "
                         f"it after --, e.g. nsadiag run -- python train.py")
    found = shutil.which(name) if os.sep not in name else None
    path = Path(found or name)
    hint = f"; run it as: nsadiag run -- python {name}" if name.endswith(".py") else ""
    if found is None and os.sep not in name:
        if path.is_dir():
            raise ValueError(f"command: {name!r} is a directory, not a program")
        if path.is_file():
            raise ValueError(f"command: {name!r} is not on PATH; give its path (./{name})"
                             f"{hint}")
        raise ValueError(f"command: {name!r} not found")
    if not path.exists():
        raise ValueError(f"command: {name!r} not found")
    if path.is_dir():
        raise ValueError(f"command: {name!r} is a directory, not a program")
    if not os.access(path, os.X_OK):
        raise ValueError(f"command: {name!r} is not executable (chmod +x {name}){hint}")
    if not _runs_as_a_program(path):
        raise ValueError(f"command: {name!r} is not a program: it has no #! line and is not "
                         f"an executable binary{hint or '; run it with the program it is for'}")
    return str(path)


def _runs_as_a_program(path: Path) -> bool:
    """Whether the kernel can exec ``path``: a script with its #! line, or a binary (ELF);
    an unreadable file is left to the start (which names what is wrong)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return True
    return head.startswith(b"#!") or head == b"\x7fELF"


def run_command(argv: list[str], run_dir: Path, stall_timeout_s: float,
                deadline_s: float, live: LiveStatus | None = None) -> TrialRecord:
    """Run ``argv`` to its verdict (see the module docstring); ValueError (one line) when it
    cannot be started, or when it is an interpreter that could not open its script (no
    verdict: nothing of the user's ran). ``live``: a status line kept below the command's
    output on the terminal, fed the watch's events."""
    check_command(argv)
    times = WatchTimes(stall_timeout_s, deadline_s)
    prepare_run_dir(run_dir)
    for earlier in run_dir.glob("proc-*"):  # an earlier run's processes are not this one's
        shutil.rmtree(earlier, ignore_errors=True)
    try:
        command = _Command(argv, command_env(run_dir), run_dir, live)
    except OSError as err:  # e.g. a script whose #! names no interpreter here
        raise ValueError(f"command: cannot start {argv[0]!r}: {err.strerror or err}") \
            from None
    write_json(run_dir / "run.json", {"command_name": "run", "argv": list(argv),
                                      "stall_timeout_s": stall_timeout_s,
                                      "deadline_s": deadline_s})
    limit_before = memory_limit()  # an OOM kill counted during the run is the kernel's
    shared = _shared_view(argv)
    if shared is not None and live is not None:  # the status line names a straggler
        shared.on_straggler = live.on_straggler
    tree = _CommandTree(command, run_dir, shared, times.capture_window_s)
    try:
        # the status line and the stall clock read one answer to "is a prompt waiting?"
        end = watch_session(tree, times, live.on_events if live is not None else None,
                            live.awaits_person if live is not None else None)
    except Interrupted as stopped:  # the diagnosis so far is kept (nsadiag.harness.interrupted)
        end = stopped.end
    if shared is not None and end.due is None and end.interrupted_at is None:
        exited_ok = command.proc.returncode == 0
        shared.settle(tree.ranks(ended_ok=exited_ok), exited_ok)
    returncode = command.proc.returncode
    never_ran = unopened_script(returncode, read_tail(run_dir / "stderr.txt",
                                                      STDERR_TAIL_BYTES)) \
        if end.due is None and end.interrupted_at is None else None
    if never_ran is not None:  # a refused command: it leaves nothing of this run behind
        for made in ("stdout.txt", "stderr.txt", "run.json", *(p.name for p in
                                                               run_dir.glob("proc-*"))):
            shutil.rmtree(run_dir / made, ignore_errors=True)
            with contextlib.suppress(OSError):
                (run_dir / made).unlink()
        raise ValueError(f"command: {never_ran}")
    reason = end.reason or ("interrupted" if end.interrupted_at is not None else None)
    limit_after = memory_limit()
    # the first process killed, or a child of it (a DataLoader worker) it then reports
    oom_killed = returncode not in (0, None) and killed_by_oom(limit_before, limit_after)
    outcome = outcome_of(returncode, reason, end.wall_s, end.ended_at,
                         cap=limit_after.cap_bytes if oom_killed and limit_after else None,
                         oom_killer=oom_killed)
    spec = {"command": list(argv), "stall_timeout_s": stall_timeout_s,
            "deadline_s": deadline_s, "subject": "the command"}
    main = training_stream(end.streams)
    ended_ok = end.due is None and returncode == 0
    record = build_record(spec, run_dir, end, main, rank_streams(end.streams), outcome,
                          ended_ok=ended_ok,
                          total_steps=main.counts.get("step", 0) if main and ended_ok else 0,
                          # a process a signal killed printed no traceback: one on
                          # stderr then is another's (a worker's, as its parent died)
                          fallback=None if end.due is not None or (returncode or 0) < 0
                          else _stderr_exception(run_dir),
                          command=command_facts(end, main, outcome, run_dir),
                          hosts=shared.view() if shared is not None else None,
                          remote=shared.remote_ranks() if shared is not None else ())
    if shared is not None:
        _write_hosts_trace(record, run_dir, shared.view())
    evidence = record.evidence
    assert evidence is not None  # build_record always makes one
    evidence.output_copies = command.lost() or None
    evidence.output_not_shown = command.not_shown() or None
    evidence.containment = command.containment
    evidence.process_memory = tree.memory.record(run_dir)
    if end.interrupted_at is not None:
        record.verdict = interrupted_verdict(record.verdict, end, main)
        evidence.interrupted = record.verdict.facts.position.interrupted
    return record


def _write_hosts_trace(record: TrialRecord, run_dir: Path, view: HostsView) -> None:
    """hosts-trace.json: every host's ranks on one timeline (nsadiag.hosts.trace); a copy
    only, so a disk that refuses it costs the trace, not the verdict."""
    evidence = record.evidence
    ranks = [RankEvidence.from_dict(r) for r in (evidence.ranks if evidence else None) or []]
    if not ranks or evidence is None:
        return
    stopped_at = evidence.outcome.ended_at or 0.0
    with contextlib.suppress(ValueError):
        write_json(run_dir / HOSTS_TRACE, hosts_trace(ranks, view, stopped_at), reserve=False)


def _shared_view(argv: list[str]) -> SharedView | None:
    """The share of this host in a job of two or more hosts (torchrun's --nnodes, or
    Slurm's SLURM_NNODES), None for a job on one host."""
    shape = job_shape(argv, os.environ)
    nodes = shape.nnodes or (int(os.environ["SLURM_NNODES"])
                             if os.environ.get("SLURM_NNODES", "").isdigit() else 1)
    if nodes < 2:
        return None
    return SharedView(shape, rank_names(os.environ).host)


CANNOT_OPEN = re.compile(r"^(?P<program>\S+): can't open file (?P<path>'.*'|\".*\"): "
                         r"\[Errno \d+\] (?P<why>.+)$")
"""CPython's one line when the script it is given cannot be opened (it exits with 2)."""
CANNOT_OPEN_EXIT = 2


def unopened_script(returncode: int | None, stderr: str) -> str | None:
    """Why the command never ran, when it is an interpreter that could not open its script
    (``python missing.py``: exit code 2 and CPython's one line, alone on stderr), as one
    line; None otherwise."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if returncode != CANNOT_OPEN_EXIT or len(lines) != 1:
        return None
    found = CANNOT_OPEN.match(lines[0].strip())
    if found is None:
        return None
    program = Path(found["program"]).name
    return f"{program} cannot open the script {found['path']}: {found['why']}"


def last_traceback(stderr: str) -> dict[str, Any] | None:
    """The last Python traceback in a command's stderr as the exception the verdict rules
    read ({"type", "message", "traceback"}), None when there is none."""
    start = stderr.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    lines = stderr[start:].splitlines()
    frames_end = next((i for i in range(1, len(lines)) if lines[i] and
                       not lines[i].startswith(" ")), None)
    if frames_end is None:
        return None
    kind, _, message = lines[frames_end].partition(":")
    if not kind or " " in kind.strip():
        return None
    return {"type": kind.strip().rsplit(".", 1)[-1], "message": message.strip(),
            "traceback": "\n".join(lines[:frames_end + 1])}


def _stderr_exception(run_dir: Path) -> dict[str, Any] | None:
    return last_traceback(read_tail(run_dir / "stderr.txt", STDERR_TAIL_BYTES))
