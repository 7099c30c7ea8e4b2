"""Typed evidence the runner collects about one trial, and its JSON form.

Every class round-trips through JSON: ``X.from_dict(json.loads(json.dumps(x.to_dict()))) == x``.
Missing optional keys read back as their defaults, so older records stay readable.

Stack frames are stored innermost first, the order py-spy prints them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

from nsadiag.record.process_memory import ProcessMemory
from nsadiag.waitfacts import ProcessWaits


@dataclass
class ProcessOutcome:
    """How the child process ended.

    ``exit_code`` is the process exit status, None when a signal ended it; ``signal`` and
    ``signal_name`` (e.g. 9, "SIGKILL") name that signal. ``killed_by_runner`` says the
    runner sent it, ``kill_reason`` why: "stall" (no heartbeat for the stall timeout) or
    "budget" (the time budget ran out). ``memory_cap_bytes`` is the cap the runner set, if
    any; ``oom_killer`` is True when the kernel reports an OOM kill of this process (cgroup
    ``memory.events`` or the kernel log). ``ended_at`` is the unix time the process ended
    or was killed, used to tell whether heartbeats were still arriving at that moment.
    """

    exit_code: int | None
    signal: int | None = None
    signal_name: str | None = None
    killed_by_runner: bool = False
    kill_reason: str | None = None
    wall_s: float = 0.0
    memory_cap_bytes: int | None = None
    oom_killer: bool = False
    ended_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessOutcome:
        return cls(
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            signal_name=data.get("signal_name"),
            killed_by_runner=bool(data.get("killed_by_runner", False)),
            kill_reason=data.get("kill_reason"),
            wall_s=float(data.get("wall_s", 0.0)),
            memory_cap_bytes=data.get("memory_cap_bytes"),
            oom_killer=bool(data.get("oom_killer", False)),
            ended_at=data.get("ended_at"),
        )


@dataclass
class StackFrame:
    """One frame: a Python function, or a native symbol when ``is_native`` is True.

    ``code`` is the source line of a Python frame when it could be read at capture time
    (py-spy does not report it), e.g. ``"lock.acquire()"``; native frames have none.
    ``locals`` holds the repr of the local variables of the few frames whose locals say
    what a process is (a DataLoader worker loop's ``worker_id``), when they were read.
    """

    function: str
    file: str
    line: int
    is_native: bool = False
    code: str | None = None
    locals: dict[str, str] | None = None

    def where(self) -> str:
        """``function (file-name:line)``, the form reasons quote."""
        name = PurePath(self.file).name if self.file else "?"
        return f"{self.function} ({name}:{self.line})"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.locals is None:
            del data["locals"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StackFrame:
        return cls(
            function=str(data["function"]),
            file=str(data.get("file", "")),
            line=int(data.get("line", 0)),
            is_native=bool(data.get("is_native", False)),
            code=data.get("code"),
            locals=data.get("locals"),
        )


@dataclass
class ThreadStack:
    """One thread of a sample. ``active`` and ``owns_gil`` are py-spy's own flags:
    ``active`` is False when py-spy judged the thread idle (blocked in a wait or sleep)."""

    thread_id: int
    name: str | None
    frames: list[StackFrame]
    os_thread_id: int | None = None
    active: bool = True
    owns_gil: bool = False

    def python_frames(self) -> list[StackFrame]:
        """The Python frames, innermost first."""
        return [frame for frame in self.frames if not frame.is_native]

    def to_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "name": self.name,
            "os_thread_id": self.os_thread_id,
            "active": self.active,
            "owns_gil": self.owns_gil,
            "frames": [frame.to_dict() for frame in self.frames],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThreadStack:
        return cls(
            thread_id=int(data["thread_id"]),
            name=data.get("name"),
            frames=[StackFrame.from_dict(frame) for frame in data.get("frames", [])],
            os_thread_id=data.get("os_thread_id"),
            active=bool(data.get("active", True)),
            owns_gil=bool(data.get("owns_gil", False)),
        )


@dataclass
class StackSample:
    """The stacks of every Python thread of process ``pid`` at unix time ``t``.

    ``cpu_seconds`` is the process CPU time (user + system, all threads) read just before
    the sample, None when unreadable. ``native`` says native frames were requested and
    collected; ``note`` says why not when they were requested and py-spy fell back.
    """

    t: float
    pid: int
    threads: list[ThreadStack]
    cpu_seconds: float | None = None
    native: bool = False
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "t": self.t,
            "pid": self.pid,
            "threads": [thread.to_dict() for thread in self.threads],
            "cpu_seconds": self.cpu_seconds,
            "native": self.native,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StackSample:
        return cls(
            t=float(data["t"]),
            pid=int(data["pid"]),
            threads=[ThreadStack.from_dict(thread) for thread in data.get("threads", [])],
            cpu_seconds=data.get("cpu_seconds"),
            native=bool(data.get("native", False)),
            note=data.get("note"),
        )


def cpu_fraction(cpu_delta_s: float | None, window_s: float | None) -> float | None:
    """CPU seconds per wall second over a watch window of ``window_s`` seconds, None when
    the CPU time or the window is unknown (a stored stall's fields, or StallEvidence's)."""
    if cpu_delta_s is None or not window_s or window_s <= 0:
        return None
    return cpu_delta_s / window_s


@dataclass
class StallEvidence:
    """What the runner saw when heartbeats stopped.

    ``since_last_event_s`` is the time from the last heartbeat to detection;
    ``cpu_delta_s`` the process CPU seconds spent over the watch window of ``window_s``
    seconds that ended at detection (None when /proc was unreadable), so
    ``cpu_delta_s / window_s`` is the CPU fraction (above 1 with several busy threads).
    ``samples`` are stack samples spaced apart; ``unavailable`` lists evidence that could
    not be collected, each with why, e.g. "py-spy: ptrace refused". ``stacks_class`` is
    what the samples read as (probes.frames.classify: "waiting", "busy-python",
    "busy-native" or "in-collective"; None without samples); ``unfinished_backward`` the
    modules whose backward started in the current step and never finished, by their
    heartbeat events, innermost (latest started) first.

    ``main_cpu_delta_s`` and ``runq_delta_s`` are the main thread's on-CPU and run-queue
    seconds over the same window (/proc/PID/task/PID/schedstat), so ``demand()`` says how
    much of the window the thread wanted the CPU whether or not a loaded machine gave it;
    ``opportunity_s`` is how long the job had to progress (quiet time minus run-queue
    waits) and ``stretched`` says the stall was declared after the watcher's longest wait
    although the processes had less opportunity than the stall timeout (a contended
    machine). ``waits`` is what the OS said the process and its children waited on at the
    end of the window (nsadiag.waitfacts.ProcessWaits; None when not read).
    """

    since_last_event_s: float
    window_s: float
    cpu_delta_s: float | None
    samples: list[StackSample] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    stacks_class: str | None = None
    unfinished_backward: list[str] = field(default_factory=list)
    main_cpu_delta_s: float | None = None
    runq_delta_s: float | None = None
    opportunity_s: float | None = None
    stretched: bool = False
    waits: ProcessWaits | None = None

    def cpu_fraction(self) -> float | None:
        """CPU seconds per wall second over the window, None when unknown."""
        return cpu_fraction(self.cpu_delta_s, self.window_s)

    def demand(self) -> float | None:
        """The main thread's (on-CPU + run-queue) seconds per wall second over the window:
        near 1 for a thread that computes (however loaded the machine), near 0 for one
        that waits; None when schedstat was unreadable."""
        if self.main_cpu_delta_s is None or self.runq_delta_s is None or self.window_s <= 0:
            return None
        return (self.main_cpu_delta_s + self.runq_delta_s) / self.window_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "since_last_event_s": self.since_last_event_s,
            "window_s": self.window_s,
            "cpu_delta_s": self.cpu_delta_s,
            "samples": [sample.to_dict() for sample in self.samples],
            "unavailable": list(self.unavailable),
            "stacks_class": self.stacks_class,
            "unfinished_backward": list(self.unfinished_backward),
            "main_cpu_delta_s": self.main_cpu_delta_s,
            "runq_delta_s": self.runq_delta_s,
            "opportunity_s": self.opportunity_s,
            "stretched": self.stretched,
            **({"waits": self.waits.to_dict()} if self.waits is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StallEvidence:
        return cls(
            since_last_event_s=float(data["since_last_event_s"]),
            window_s=float(data.get("window_s", data["since_last_event_s"])),
            cpu_delta_s=data.get("cpu_delta_s"),
            samples=[StackSample.from_dict(sample) for sample in data.get("samples", [])],
            unavailable=[str(item) for item in data.get("unavailable", [])],
            stacks_class=data.get("stacks_class"),
            unfinished_backward=[str(m) for m in data.get("unfinished_backward", [])],
            main_cpu_delta_s=data.get("main_cpu_delta_s"),
            runq_delta_s=data.get("runq_delta_s"),
            opportunity_s=data.get("opportunity_s"),
            stretched=bool(data.get("stretched", False)),
            waits=ProcessWaits.from_dict(data["waits"]) if data.get("waits") else None,
        )


@dataclass
class Evidence:
    """Everything known about one finished trial.

    ``spec`` is a summary of the trial spec. ``events`` are the last heartbeat events
    (dicts in the heartbeat format, oldest first); ``event_counts`` counts every event of
    the heartbeat file by kind ("start", "module", "step", "end"). ``result`` is the
    child's result dict, None when it never wrote one. ``stall`` is what the runner's stall
    watch collected: at a stall kill, or just before a budget kill (its samples then give a
    slow run's hot frame); None when nothing was. ``expected_events_per_step`` is the
    number of module events one full step emitted, measured on step 0 when it completed,
    else None. ``stall_timeout_s`` is the runner's stall timeout: a run with a
    heartbeat within that long of its end was still progressing.

    ``pulses`` are the last pulses of the progress sampler (nsadiag.probes.sampler);
    ``load`` what the machine and the child's main thread looked like over its life
    (nsadiag.harness.machine.machine_load: load averages and usable CPUs at start and end;
    the main thread's wall, on-CPU and run-queue seconds, its CPU share and demand);
    ``profile`` the sampled profile the child wrote (profile.json of
    nsadiag.probes.sampler). Each is empty or None when not measured.

    ``thread_exceptions`` are the exceptions that ended other threads of the process
    (nsadiag.harness.thread_exceptions: t, thread, type, message, where); ``others`` the
    other live processes of the job sampled at a stall, those nsadiag does not watch
    included (each {"pid", "role", "stall"}: role in words, "DataLoader worker 0 of rank
    1", and a StallEvidence dict); ``crash`` what a process that died of a signal left
    (nsadiag.harness.crash: its fatal-error dump, the telling lines of stderr).

    The record adds what it knows beyond one process (each absent, None, when it does
    not): ``ranks`` every rank's RankEvidence dict (a job of two or more ranks), ``job``
    a trial's job shape (JobFacts), ``ddp`` a DDP trial's set-up (DdpFacts), ``command``
    the facts of a user's command (CommandFacts), ``hosts`` the view of a job's other
    hosts, ``source`` the code of the lines the record names
    (nsadiag.sourcelines.capture), ``output_copies`` and ``output_not_shown`` what became
    of a command's output, ``heartbeats_lost`` the heartbeat files a full disk stopped
    (each "proc-N/events.jsonl: events after #K not written: ... at HH:MM:SS UTC"; their
    events came through the slot, nsadiag.harness.slot), ``heartbeats_thinned`` those that
    spent their budget and were thinned (nsadiag.harness.heartbeat.THIN_BURST_BYTES),
    ``containment`` how its
    processes were held, ``interrupted`` what an interrupting stop left (the verdict's
    ``facts.position.interrupted``), ``process_memory`` every process's private and shared
    memory over the run (nsadiag.harness.procmem). ``unknown`` keeps the keys at this level
    that this nsadiag does not read, so they are written back as they were.
    """

    spec: dict[str, Any]
    events: list[dict[str, Any]]
    event_counts: dict[str, int]
    result: dict[str, Any] | None
    outcome: ProcessOutcome
    stall: StallEvidence | None
    expected_events_per_step: int | None
    total_steps: int
    stall_timeout_s: float | None = None
    pulses: list[dict[str, Any]] = field(default_factory=list)
    load: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    thread_exceptions: list[dict[str, Any]] = field(default_factory=list)
    others: list[dict[str, Any]] = field(default_factory=list)
    crash: dict[str, Any] | None = None
    ranks: list[dict[str, Any]] | None = None
    job: JobFacts | None = None
    ddp: DdpFacts | None = None
    command: CommandFacts | None = None
    hosts: dict[str, Any] | None = None
    source: dict[str, Any] | None = None
    output_copies: list[str] | None = None
    heartbeats_lost: list[str] | None = None
    heartbeats_thinned: list[str] | None = None
    output_not_shown: dict[str, Any] | None = None
    containment: dict[str, Any] | None = None
    interrupted: dict[str, Any] | None = None
    process_memory: ProcessMemory | None = None
    unknown: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, its keys in the order the record is built (so that a stored
        record writes back byte for byte)."""
        optional = {name: value for name, value in (
            ("thread_exceptions", self.thread_exceptions), ("others", self.others),
            ("crash", self.crash)) if value}
        added = {name: value for name, value in (
            ("ranks", self.ranks), ("job", self.job.to_dict() if self.job else None),
            ("ddp", self.ddp.to_dict() if self.ddp else None)) if value is not None}
        command = self.command.to_dict() if self.command is not None else {}
        later = {name: value for name, value in (
            ("hosts", self.hosts), ("source", self.source),
            ("output_copies", self.output_copies),
            ("heartbeats_lost", self.heartbeats_lost),
            ("heartbeats_thinned", self.heartbeats_thinned),
            ("output_not_shown", self.output_not_shown), ("containment", self.containment),
            ("interrupted", self.interrupted),
            ("process_memory", self.process_memory.to_dict() if self.process_memory else None)
        ) if value is not None}
        return {
            "spec": self.spec,
            "events": self.events,
            "event_counts": self.event_counts,
            "result": self.result,
            "outcome": self.outcome.to_dict(),
            "stall": self.stall.to_dict() if self.stall else None,
            "expected_events_per_step": self.expected_events_per_step,
            "total_steps": self.total_steps,
            "stall_timeout_s": self.stall_timeout_s,
            "pulses": list(self.pulses),
            "load": self.load,
            "profile": self.profile,
            **optional,
            **added,
            **command,
            **later,
            **self.unknown,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Evidence:
        stall = data.get("stall")
        command = CommandFacts.from_dict(data) if "processes" in data else None
        read = _KNOWN if command is not None else _KNOWN - _COMMAND_KEYS
        return cls(
            spec=dict(data.get("spec", {})),
            events=list(data.get("events", [])),
            event_counts={str(k): int(v) for k, v in data.get("event_counts", {}).items()},
            result=data.get("result"),
            outcome=ProcessOutcome.from_dict(data["outcome"]),
            stall=StallEvidence.from_dict(stall) if stall else None,
            expected_events_per_step=data.get("expected_events_per_step"),
            total_steps=int(data.get("total_steps", 0)),
            stall_timeout_s=data.get("stall_timeout_s"),
            pulses=list(data.get("pulses") or []),
            load=data.get("load"),
            profile=data.get("profile"),
            thread_exceptions=list(data.get("thread_exceptions") or []),
            others=list(data.get("others") or []),
            crash=data.get("crash"),
            ranks=data.get("ranks"),
            job=JobFacts.from_dict(data["job"]) if data.get("job") else None,
            ddp=DdpFacts.from_dict(data["ddp"]) if data.get("ddp") else None,
            command=command,
            hosts=data.get("hosts"),
            source=data.get("source"),
            output_copies=data.get("output_copies"),
            heartbeats_lost=data.get("heartbeats_lost"),
            heartbeats_thinned=data.get("heartbeats_thinned"),
            output_not_shown=data.get("output_not_shown"),
            containment=data.get("containment"),
            interrupted=data.get("interrupted"),
            process_memory=ProcessMemory.from_dict(data["process_memory"])
            if data.get("process_memory") is not None else None,
            unknown={k: v for k, v in data.items() if k not in read},
        )


@dataclass(frozen=True)
class JobFacts:
    """The shape of a trial's job (nsadiag.harness.jobs.JobSpec): its kind ("trial",
    "check", ...), the check it runs (None: none) and its number of ranks."""

    kind: str
    check: str | None
    world_size: int

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "check": self.check, "world_size": self.world_size}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobFacts:
        return cls(kind=str(data["kind"]), check=data.get("check"),
                   world_size=int(data.get("world_size") or 1))


@dataclass(frozen=True)
class DdpFacts:
    """A DDP trial's set-up: its ranks, process-group backend and timeout, whether that
    timeout outlasts the stall timeout plus the stack sampling (False: a stalled
    collective raises before the ranks are sampled; None: not known), and the NCCL
    Flight Recorder dumps it left (nsadiag.probes.flight_recorder.collect: each {"file",
    "summary"} or {"file", "unreadable"})."""

    world_size: int
    backend: str | None
    pg_timeout_s: float | None = None
    pg_timeout_outlasts_capture: bool | None = None
    flight_recorder: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "backend": self.backend,
                "pg_timeout_s": self.pg_timeout_s,
                "pg_timeout_outlasts_capture": self.pg_timeout_outlasts_capture,
                "flight_recorder": list(self.flight_recorder)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DdpFacts:
        return cls(world_size=int(data["world_size"]), backend=data.get("backend"),
                   pg_timeout_s=data.get("pg_timeout_s"),
                   pg_timeout_outlasts_capture=data.get("pg_timeout_outlasts_capture"),
                   flight_recorder=list(data.get("flight_recorder") or []))


@dataclass(frozen=True)
class CommandFacts:
    """The facts of a user's command or block beyond one process's Evidence
    (nsadiag.harness.record.command_facts): every process with its role, events and place
    at the stop (dicts: name, pid, rank, events, role, place, stall), the name of the one
    that trained (None: none did), the exit code and how the run ended, in words."""

    processes: list[dict[str, Any]]
    main_process: str | None
    exit_code: int | None
    ended: str | None
    # an exit with a code and no traceback: the script's calls that exit with that code
    # and the last line it printed (nsadiag.probes.exit_calls)
    exit_calls: list[dict[str, Any]] | None = None
    last_output: str | None = None

    def to_dict(self) -> dict[str, Any]:
        more = {name: value for name, value in (("exit_calls", self.exit_calls),
                                                ("last_output", self.last_output))
                if value is not None}
        return {"processes": self.processes, "main_process": self.main_process,
                "exit_code": self.exit_code, "ended": self.ended, **more}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommandFacts:
        return cls(processes=list(data["processes"]), main_process=data.get("main_process"),
                   exit_code=data.get("exit_code"), ended=data.get("ended"),
                   exit_calls=data.get("exit_calls"), last_output=data.get("last_output"))


_COMMAND_KEYS = frozenset({"processes", "main_process", "exit_code", "ended", "exit_calls",
                           "last_output"})
_KNOWN = frozenset({
    "spec", "events", "event_counts", "result", "outcome", "stall", "expected_events_per_step",
    "total_steps", "stall_timeout_s", "pulses", "load", "profile", "thread_exceptions",
    "others", "crash", "ranks", "job", "ddp", "hosts", "source", "output_copies",
    "heartbeats_lost", "heartbeats_thinned", "output_not_shown", "containment",
    "interrupted", "process_memory"}) | _COMMAND_KEYS
"""The keys of an Evidence's JSON form that it reads into fields (a command's only with
its processes)."""
