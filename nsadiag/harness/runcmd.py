"""`nsadiag run -- CMD`: the user's own command, unchanged, watched to a verdict.

``run_command(argv, run_dir, stall_timeout_s, deadline_s)`` starts the command in a
session of its own with ``nsadiag/harness/inject`` (the sitecustomize hook alone) first
on PYTHONPATH and NSADIAG_RUN_DIR set, so every Python process it starts (``python
train.py``, ``python -m pkg``, torchrun and each of its ranks) writes its own heartbeat
into ``<run_dir>/proc-<pid>/`` (nsadiag.harness.watched). The command's stdout and stderr
pass through to nsadiag's own (through a pseudo-terminal when that is a terminal, so the
command sees one, as it would without nsadiag) and are kept in ``stdout.txt`` and
``stderr.txt``; ``run.json`` names the command. The copies never hold the command up: its
output is passed to the terminal first and always drained, so a disk that fills stops the
copies (where and why is kept in the evidence, ``output_copies``), never the command; the
verdict is still written (nsadiag.rundir's reserve).

The one watcher (nsadiag.harness.watch) follows every process's stream as it appears,
with the stall clock on progress of any of them. On a stall every watched process, and
every other live Python process of the command's tree (a DataLoader worker forked without
the injected hook, a launcher: nsadiag.harness.tree), is sampled at once
(nsadiag.harness.jobs.capture_all) before the whole tree is killed
(every process it started, those that left its session included: nsadiag.harness.launch);
at ``deadline_s`` (the user's own job timeout) a progressing run is SLOW with its rate and
time per step, never a hang because a timer fired. A command that exits by itself gets
OK for exit code 0, else the verdict of the exception a process recorded (or the last
traceback on its stderr), else the exit code's verdict.

The record (``build_record``) names the training process (the one with the most
heartbeat events) and the evidence of every process. A torchrun job of two or more ranks
is decided across ranks, as a `nsadiag ddp` trial is (nsadiag.verdict.ranks): the
collectives each rank issued (counted in every process, DDP's buckets included), where
each rank waits, and which rank left the common path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import termios
import threading
import time
from pathlib import Path
from typing import IO, Any

from nsadiag.evidence import Evidence, ProcessOutcome, StallEvidence
from nsadiag.harness import crash, stop, thread_exceptions
from nsadiag.harness.collectives import summarize
from nsadiag.harness.jobs import (
    capture_all,
    machine_load,
    others_evidence,
    outcome_of,
    profile_summary,
    rank_evidence,
    unwatched,
)
from nsadiag.harness.launch import Launched
from nsadiag.harness.watch import Stream, Watcher
from nsadiag.probes.frames import describe_place, place_sentence
from nsadiag.probes.gpu import gpu_state
from nsadiag.rundir import TrialRecord, create_file, prepare_run_dir, read_tail, write_json
from nsadiag.spec import WATCH_POLL_S
from nsadiag.verdict.ranks import decide_ranks
from nsadiag.verdict.rules import decide

INJECT = Path(__file__).resolve().parent / "inject"
UNBOUNDED_STEPS = 2**62  # a user's run has no step count: it ends when the command does
STDERR_TAIL_BYTES = 1 << 20  # where the last traceback is looked for


def command_env(run_dir: Path) -> dict[str, str]:
    """This environment, with the directory of the injected sitecustomize (it holds
    nothing else, and the hook takes it off ``sys.path`` again) first on PYTHONPATH and
    the run directory named. Nothing of nsa-diag's own is put on the path: the command
    imports the packages it would import without nsadiag (nsadiag.harness.inject)."""
    path = [str(INJECT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                            if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path),
            "NSADIAG_RUN_DIR": str(run_dir.resolve()), "PYTHONUNBUFFERED": "1"}


class _Tee(threading.Thread):
    """Copies one output of the command (a pipe, or a pseudo-terminal's master side) to the
    terminal and to a file, as it comes: the terminal first, and the output is drained to
    its end whatever happens to the file. A file that cannot be written (a full disk) ends
    the copy, and ``lost`` says where."""

    def __init__(self, fd: int, terminal: IO[bytes], path: Path):
        super().__init__(daemon=True)
        self.fd, self.terminal, self.path = fd, terminal, path
        self.copied = 0
        self.lost: str | None = None

    def run(self) -> None:
        kept = self._open()
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # EIO: no process holds the pseudo-terminal any more
                break
            if not chunk:
                break
            try:
                self.terminal.write(chunk)
                self.terminal.flush()
            except (OSError, ValueError):
                pass  # a closed terminal must not stop the copy to the file
            if kept is not None:
                kept = self._keep(kept, chunk)
        if kept is not None:
            with contextlib.suppress(OSError):
                kept.close()
        os.close(self.fd)

    def _open(self) -> IO[bytes] | None:
        try:
            return create_file(self.path)
        except OSError as err:
            self.lost = f"{self.path.name}: not kept ({err.strerror or err})"
            return None

    def _keep(self, kept: IO[bytes], chunk: bytes) -> IO[bytes] | None:
        """Append a chunk to the copy; None once the copy has stopped."""
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


def _output_for(terminal: IO[bytes]) -> tuple[int, int]:
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


class _Command(Launched):
    """The user's command with its output passed through and kept."""

    def __init__(self, argv: list[str], env: dict[str, str], run_dir: Path):
        terminals = (sys.stdout.buffer, sys.stderr.buffer)
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
        self.tees = [_Tee(out[0], terminals[0], run_dir / "stdout.txt"),
                     _Tee(err[0], terminals[1], run_dir / "stderr.txt")]
        for tee in self.tees:
            tee.start()

    def finish(self) -> None:
        for tee in self.tees:
            tee.join(timeout=5)

    def lost(self) -> list[str]:
        """Why a copy of the output is incomplete, one line per copy (none: both whole)."""
        return [tee.lost for tee in self.tees if tee.lost]


def _new_streams(run_dir: Path, watcher: Watcher, known: set[str]) -> None:
    for path in sorted(run_dir.glob("proc-*/events.jsonl")):
        name = path.parent.name
        if name not in known:
            known.add(name)
            watcher.add_stream(Stream(name, path, UNBOUNDED_STEPS))


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
    return str(path)


def run_command(argv: list[str], run_dir: Path, stall_timeout_s: float,
                deadline_s: float) -> TrialRecord:
    """Run ``argv`` to its verdict (see the module docstring); ValueError (one line) when it
    cannot be started."""
    check_command(argv)
    prepare_run_dir(run_dir)
    for earlier in run_dir.glob("proc-*"):  # an earlier run's processes are not this one's
        shutil.rmtree(earlier, ignore_errors=True)
    watcher = Watcher([], stall_timeout_s, deadline_s)
    known: set[str] = set()
    load_before = machine_load()
    try:
        command = _Command(argv, command_env(run_dir), run_dir)
    except OSError as err:  # e.g. a script whose #! names no interpreter here
        raise ValueError(f"command: cannot start {argv[0]!r}: {err.strerror or err}") \
            from None
    write_json(run_dir / "run.json", {"command_name": "run", "argv": list(argv),
                                      "stall_timeout_s": stall_timeout_s,
                                      "deadline_s": deadline_s})
    started = time.time()
    due, stalls, gpu, decided_at = None, {}, None, None
    others: list[Any] = []
    try:
        while command.poll() is None:
            stop.check()
            _new_streams(run_dir, watcher, known)
            watcher.read()
            due = watcher.due()
            if due is not None:
                decided_at = time.time()  # capturing takes seconds and pauses the processes
                pids = {s.name: s.pid for s in watcher.streams if s.pid}
                dirs = {s.name: s.path.parent for s in watcher.streams}
                others = unwatched(command, set(pids.values())) if due.reason == "stall" \
                    else []
                stalls = capture_all(pids, dirs, due, stall_timeout_s, others)
                gpu = gpu_state()
                break
            time.sleep(WATCH_POLL_S)
    finally:
        ended_at = decided_at or time.time()
        command.kill_all()
        command.finish()
    _new_streams(run_dir, watcher, known)
    watcher.read()
    returncode = command.proc.returncode
    reason = due.reason if due is not None else None
    outcome = outcome_of(returncode, reason, ended_at - started, ended_at, None)
    spec = {"command": list(argv), "stall_timeout_s": stall_timeout_s,
            "deadline_s": deadline_s, "subject": "the command"}
    record = build_record(spec, run_dir, watcher.streams, outcome, stalls, gpu,
                          {"start": load_before, "end": machine_load()},
                          ended_ok=due is None and returncode == 0,
                          fallback=None if due is not None else _stderr_exception(run_dir),
                          others=others_evidence(others, stalls))
    if command.lost():
        record.evidence["output_copies"] = command.lost()
    return record


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


def _training_stream(streams: list[Stream]) -> Stream | None:
    """The process that trained: the most heartbeat events besides pulses."""
    return max(streams, key=_weight, default=None)


def _weight(stream: Stream) -> int:
    return sum(n for kind, n in stream.counts.items() if kind != "pulse")


def _rank_streams(streams: list[Stream]) -> dict[int, Stream]:
    """{rank: stream} of the torchrun ranks among the watched processes (the busiest
    stream when two claim one rank)."""
    ranks: dict[int, Stream] = {}
    for stream in streams:
        if isinstance(stream.rank, int) and (stream.rank not in ranks or
                                             _weight(stream) > _weight(ranks[stream.rank])):
            ranks[stream.rank] = stream
    return ranks


def _read_result(stream: Stream) -> dict[str, Any] | None:
    """The result.json a watched process wrote when an exception ended it."""
    try:
        return json.loads((stream.path.parent / "result.json").read_text())
    except (OSError, ValueError):
        return None


def stream_result(stream: Stream, ended_ok: bool) -> dict[str, Any] | None:
    """What one process's end says: its exception (result.json), else ok with its steps
    and collectives when the whole command ended well, else nothing."""
    result = _read_result(stream)
    if result is not None:
        return result
    if not ended_ok:
        return None
    return {"status": "ok", "steps_done": stream.counts.get("step", 0),
            "collectives_issued": summarize(stream.collectives)["issued"]}


def how_it_ended(outcome: ProcessOutcome) -> str:
    """"exit code 1", "killed by SIGABRT", "stopped by nsadiag at a stall": how the
    command ended, in words (a signal leaves no exit code)."""
    if outcome.killed_by_runner:
        return {"stall": "stopped by nsadiag at a stall",
                "budget": "stopped by nsadiag at the deadline"}.get(
            outcome.kill_reason or "", "stopped by nsadiag")
    if outcome.signal is not None:
        return f"killed by {outcome.signal_name or f'signal {outcome.signal}'}"
    if outcome.exit_code is None:
        return "stopped by nsadiag"
    return f"exit code {outcome.exit_code}"


def _place(stall: StallEvidence | None) -> str | None:
    """Where a process was at the stop, in the user's terms (nsadiag.probes.frames
    .place_sentence of its last sample); None without samples."""
    if stall is None or not stall.samples:
        return None
    place = describe_place(stall.samples[-1])
    return place_sentence(place) if place else None


def build_record(spec: dict[str, Any], run_dir: Path, streams: list[Stream],
                 outcome: ProcessOutcome, stalls: dict[str, StallEvidence], gpu: Any,
                 load: dict[str, Any], ended_ok: bool,
                 fallback: dict[str, Any] | None = None,
                 others: list[dict[str, Any]] | None = None) -> TrialRecord:
    """The record of a watched user's run (``nsadiag run``, ``nsadiag.watch()``): the
    Evidence of the training process, and for a torchrun job of two or more ranks each
    rank's RankEvidence decided across ranks (nsadiag.verdict.ranks). ``ended_ok``: the
    command or block ended by itself, successfully; ``fallback``: the exception to take
    when no process recorded one (the last traceback on the command's stderr); ``others``:
    the processes sampled at a stall that write no heartbeat (Evidence.others). A process
    that died of a signal is read for what it left (nsadiag.harness.crash), and the
    exceptions that ended other threads of the training process are the evidence's
    ``thread_exceptions``."""
    main = _training_stream(streams)
    stderr_path = run_dir / "stderr.txt"
    steps = main.counts.get("step", 0) if main else 0
    result = stream_result(main, ended_ok) if main else None
    if result is None and ended_ok:
        result = {"status": "ok", "steps_done": steps}
    if result is None and fallback is not None:
        result = {"status": "error", "exception": fallback}
    evidence = Evidence(
        spec=spec, events=list(main.last) if main else [],
        event_counts=dict(main.counts) if main else {}, result=result, outcome=outcome,
        stall=stalls.get(main.name) if main else None, expected_events_per_step=None,
        total_steps=steps if ended_ok else 0, stall_timeout_s=spec["stall_timeout_s"],
        pulses=list(main.pulses) if main else [], load=load,
        profile=profile_summary(main.path.parent / "profile.json") if main else None,
        thread_exceptions=thread_exceptions.read(
            main.path.parent / thread_exceptions.FILE_NAME) if main else [],
        others=list(others or []),
        crash=crash.read(main.path.parent, stderr_path, main.pid)
        if main and outcome.signal is not None and not outcome.killed_by_runner else None)
    ranks = _rank_streams(streams)
    data: dict[str, Any]
    if len(ranks) >= 2:
        rank_list = [rank_evidence(r, s, stream_result(s, ended_ok), stalls.get(s.name),
                                   None if outcome.killed_by_runner else stderr_path)
                     for r, s in sorted(ranks.items())]
        verdict = decide_ranks(evidence, rank_list)
        data = evidence.to_dict()
        data["ranks"] = [r.to_dict() for r in rank_list]
    else:
        verdict = decide(evidence)
        data = evidence.to_dict()
    data["processes"] = [{"name": s.name, "pid": s.pid, "rank": s.rank,
                          "events": dict(s.counts),
                          "role": f"rank {s.rank}" if isinstance(s.rank, int) else
                          "the training process" if s is main else "a watched process",
                          "place": _place(stalls.get(s.name)),
                          "stall": stalls[s.name].to_dict() if s.name in stalls else None}
                         for s in streams] + \
        [{"name": f"pid-{other['pid']}", "pid": other["pid"], "rank": None, "events": {},
          "role": other["role"], "stall": other["stall"],
          "place": _place(StallEvidence.from_dict(other["stall"]))}
         for other in others or []]
    data["main_process"] = main.name if main else None
    data["exit_code"] = outcome.exit_code
    data["ended"] = how_it_ended(outcome)
    with contextlib.suppress(ValueError):  # a copy only: the record keeps the evidence
        write_json(run_dir / "evidence.json", data, reserve=False)
    return TrialRecord(spec=spec, evidence=data, verdict=verdict.to_dict(),
                       trial_dir=str(run_dir), wall_s=outcome.wall_s, gpu=gpu)
