"""Run one job to its verdict: launch, watch, capture evidence, stop everything, decide.

``run_job(job)`` starts ``python -m nsadiag.harness.child job.json`` (under torchrun for
world_size > 1, each rank writing <trial_dir>/rank-<r>/) in a session of its own, follows
every process's heartbeat with the one watcher (nsadiag.harness.watch), and when the
watcher says so captures evidence of every process at once:

stall   several py-spy samples spaced over a window (faulthandler dumps when py-spy is
        missing or refused), the CPU time and the main thread's on-CPU and run-queue time
        over the same window, a faulthandler dump, the GPU state; with NCCL a Flight
        Recorder dump of every rank;
budget  two stack samples of every process (a slow run's hot frame).

Then every process of the job is killed, on every path out (Ctrl-C included), including
those that left its session (nsadiag.harness.launch; a reaper process does it if nsadiag
itself dies), and the record is built: the Evidence of the job (for several ranks, also each rank's
RankEvidence, decided across ranks by nsadiag.verdict.ranks), the verdict, and the trial
directory. ``run_trial``, ``run_ddp_trial`` and ``run_check_job`` are the three shapes of
job the commands run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from nsadiag.evidence import Evidence, ProcessOutcome, StallEvidence
from nsadiag.harness import crash, stop, thread_exceptions
from nsadiag.harness.collectives import summarize
from nsadiag.harness.launch import Launched
from nsadiag.harness.rank import pg_timeout_for
from nsadiag.harness.tree import python_processes, roles
from nsadiag.harness.watch import Due, Stream, Watcher
from nsadiag.probes import flight_recorder, frames, stacks
from nsadiag.probes.gpu import gpu_state
from nsadiag.probes.profile import folded, read_profile
from nsadiag.probes.profile import summarize as summarize_profile
from nsadiag.rundir import TrialRecord, create_file, write_json, write_text
from nsadiag.spec import WATCH_POLL_S, JobSpec, TrialSpec
from nsadiag.verdict.ranks import STARTED_KEEP, RankEvidence, decide_ranks
from nsadiag.verdict.rules import decide

STACK_SAMPLES = 3
SAMPLE_TIMEOUT_S = 8.0
"""Each py-spy sample of a stalled process is given this long (a loaded machine)."""
DEADLINE_SLACK_S = 0.05
"""A sample due this little after its deadline is still taken (clock readings differ)."""

OnEvents = Callable[[list[dict]], None]


# ---- launching -------------------------------------------------------------------------------


def child_command(job: JobSpec, job_path: Path) -> list[str]:
    """The command line of the job's child (torchrun for several ranks)."""
    child = ["-m", "nsadiag.harness.child", str(job_path)]
    if job.world_size == 1:
        return [sys.executable, *child]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(job.world_size), *child]


def child_env(job: JobSpec, trial_dir: Path,
              changes: dict[str, str | None] | None = None) -> dict[str, str]:
    """This process's environment for the child, with `changes` (None removes a name)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name, value in (changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    if job.world_size > 1:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    if job.world_size > 1 and job.ddp_backend == "nccl":
        env.update(flight_recorder.child_env(trial_dir))
    return env


# ---- evidence ----------------------------------------------------------------------------


def sample_stacks(pid: int, count: int, interval_s: float, *, timeout_s: float | None = None,
                  faulthandler_file: Path | None = None, native: bool = True,
                  local_names: bool = False, deadline: float | None = None
                  ) -> tuple[list[Any], list[str]]:
    """`count` samples `interval_s` apart (py-spy, with native frames when `native` and it
    can, else the faulthandler dump into `faulthandler_file`), and the reasons for any
    sample that could not be taken. `timeout_s` bounds each sample (default: max(5 s, 4
    intervals)). Without `native` py-spy does not pause the process; `local_names` reads
    the locals that say what a process is (nsadiag.probes.stacks.KEEP_LOCALS). With
    `deadline` (a time.monotonic() reading) the samples are taken at fixed times spread
    from now to it, a late sample is not followed by the full interval, and none starts
    after it: the whole takes about as long as asked, however slow each sample is."""
    samples, unavailable = [], []
    start = time.monotonic()
    for i in range(count):
        if i and deadline is None:
            time.sleep(interval_s)
        elif i:
            due = start + i * interval_s
            if due > deadline + DEADLINE_SLACK_S or time.monotonic() > deadline:
                break
            time.sleep(max(0.0, due - time.monotonic()))
        limit = timeout_s if timeout_s is not None else max(5.0, interval_s * 4)
        if deadline is not None:
            limit = max(0.5, min(limit, deadline - time.monotonic()))
        taken = stacks.capture(pid, native=native, timeout_s=limit,
                               faulthandler_file=faulthandler_file, local_names=local_names)
        if isinstance(taken, str):
            unavailable.append(taken)
        else:
            samples.append(taken)
    return samples, sorted(set(unavailable))


def _thread_clock(pid: int) -> tuple[float, float] | None:
    """(on-CPU, run-queue) seconds of the main thread of `pid`."""
    try:
        with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as handle:
            run_ns, wait_ns, _ = handle.read().split()
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None


def capture_stall(pid: int, since_last_event_s: float, window_s: float,
                  faulthandler_path: Path | None, timeout_s: float | None = None,
                  count: int = STACK_SAMPLES, native: bool = True, dump: bool = True,
                  local_names: bool = False, deadline: float | None = None
                  ) -> StallEvidence:
    """`count` stack samples spread over `window_s`, the CPU time the process used
    meanwhile (and its main thread's on-CPU and run-queue time), and with `dump` a
    faulthandler dump of all threads into `faulthandler_path` (SIGUSR1, sent only when the
    process has its handler installed; None: the file the process holds open, see
    probes.stacks). A process forked from a watched one inherits its handler and its open
    dump file: it must be sampled without `dump`, or its dump would land in the parent's
    file. `deadline` bounds the samples (see sample_stacks)."""
    cpu_before, clock_before = stacks.process_cpu_seconds(pid), _thread_clock(pid)
    started = time.monotonic()
    # against a deadline the last sample falls at the window's end
    interval = window_s / (max(count - 1, 1) if deadline is not None else count)
    samples, unavailable = sample_stacks(pid, count, interval,
                                         timeout_s=timeout_s,
                                         faulthandler_file=faulthandler_path, native=native,
                                         local_names=local_names, deadline=deadline)
    elapsed = time.monotonic() - started
    cpu_after, clock_after = stacks.process_cpu_seconds(pid), _thread_clock(pid)
    cpu_delta = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    main_cpu = runq = None
    if clock_before and clock_after:
        main_cpu, runq = clock_after[0] - clock_before[0], clock_after[1] - clock_before[1]
    if dump and not any((s.note or "").startswith("stacks from faulthandler")
                        for s in samples):
        dumped = stacks.faulthandler_capture(pid, faulthandler_path)  # only if registered
        if isinstance(dumped, str):
            unavailable.append(dumped)
    return StallEvidence(since_last_event_s=since_last_event_s, window_s=elapsed,
                         cpu_delta_s=cpu_delta, samples=samples, unavailable=unavailable,
                         stacks_class=frames.classify(samples) if samples else None,
                         main_cpu_delta_s=main_cpu, runq_delta_s=runq)


def cgroup_oom_kills(path: Path = Path("/sys/fs/cgroup/memory.events")) -> int | None:
    """The cgroup's count of kernel OOM kills (cgroup v2), None when unreadable."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def outcome_of(returncode: int | None, reason: str | None, wall_s: float, ended_at: float,
               cap: int | None, oom_killer: bool = False) -> ProcessOutcome:
    """How the launcher ended, as the verdict rules read it."""
    if returncode is not None and returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = None
        return ProcessOutcome(exit_code=None, signal=number, signal_name=name,
                              killed_by_runner=reason is not None, kill_reason=reason,
                              wall_s=wall_s, memory_cap_bytes=cap, ended_at=ended_at,
                              oom_killer=oom_killer and reason is None)
    return ProcessOutcome(exit_code=returncode, killed_by_runner=False, wall_s=wall_s,
                          memory_cap_bytes=cap, ended_at=ended_at)


def cpu_stat(path: Path = Path("/proc/stat")) -> dict[str, int | None] | None:
    """The machine's cumulative CPU time in jiffies: {"total", "steal"} from the first
    line of /proc/stat (steal None where the kernel has no steal column); None when
    unreadable. Two readings give the share of CPU time a hypervisor stole between them."""
    try:
        with open(path) as handle:
            fields = handle.readline().split()
        values = [int(x) for x in fields[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is
    # already counted in user and nice
    return {"total": sum(values[:8]), "steal": values[7] if len(values) > 7 else None}


def machine_load() -> dict[str, Any]:
    """Load averages, usable CPUs and the cumulative CPU times (with steal) now."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        one = five = fifteen = None
    return {"loadavg": [one, five, fifteen], "cpus": len(os.sched_getaffinity(0)),
            "cpu_stat": cpu_stat()}


@dataclass
class _Capture:
    """What was captured when the watcher said stop."""

    due: Due | None
    stalls: dict[str, StallEvidence]
    gpu: Any
    others: list[dict[str, Any]] = field(default_factory=list)


OTHER = "other-"
"""capture_all's key prefix for a process that writes no heartbeat: other-<pid>."""


def capture_all(pids: dict[str, int], dirs: dict[str, Path], due: Due,
                stall_timeout_s: float,
                others: Sequence[psutil.Process] = ()) -> dict[str, StallEvidence]:
    """Evidence of every process at the same time (one thread each): the watched ones by
    name, and at a stall each of ``others`` (the job's processes that write no heartbeat,
    nsadiag.harness.tree) under ``other-<pid>``, sampled without pausing it, with the
    locals that say what it is and no faulthandler dump."""
    found: dict[str, StallEvidence] = {}
    window = min(max(1.5, stall_timeout_s / 2), 6.0)

    def stall(name: str, pid: int) -> None:
        if name.startswith(OTHER):
            found[name] = capture_stall(pid, due.quiet_s, window, None,
                                        timeout_s=SAMPLE_TIMEOUT_S, native=False, dump=False,
                                        local_names=True)
        else:
            found[name] = capture_stall(pid, due.quiet_s, window,
                                        dirs[name] / "faulthandler.txt",
                                        timeout_s=SAMPLE_TIMEOUT_S)
        found[name].opportunity_s, found[name].stretched = due.opportunity_s, due.stretched

    def budget(name: str, pid: int) -> None:
        samples, unavailable = sample_stacks(pid, 2, 0.5, timeout_s=SAMPLE_TIMEOUT_S,
                                             faulthandler_file=dirs[name] / "faulthandler.txt")
        found[name] = StallEvidence(since_last_event_s=due.quiet_s, window_s=1.0,
                                    cpu_delta_s=None, samples=samples, unavailable=unavailable,
                                    stacks_class=frames.classify(samples) if samples else None,
                                    opportunity_s=due.opportunity_s)

    target = stall if due.reason == "stall" else budget
    jobs = dict(pids)
    if due.reason == "stall":
        jobs.update({f"{OTHER}{process.pid}": process.pid for process in others})
    threads = [threading.Thread(target=target, args=(name, pid)) for name, pid in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found


def others_evidence(processes: Sequence[psutil.Process], found: dict[str, StallEvidence]
                    ) -> list[dict[str, Any]]:
    """The ``Evidence.others`` of the processes capture_all sampled under other-<pid>: pid,
    role (nsadiag.harness.tree.roles) and their StallEvidence as a dict."""
    stalls = {process.pid: found.get(f"{OTHER}{process.pid}") for process in processes}
    last = {pid: stall.samples[-1] if stall and stall.samples else None
            for pid, stall in stalls.items()}
    named = roles(processes, last)
    return [{"pid": pid, "role": named[pid], "stall": stall.to_dict()}
            for pid, stall in stalls.items() if stall is not None]


def unwatched(launched: Launched, watched: set[int]) -> list[psutil.Process]:
    """The live Python processes of a job that write no heartbeat (see
    nsadiag.harness.tree)."""
    try:
        return python_processes(launched.members(), watched)
    except psutil.Error:
        return []


# ---- running -----------------------------------------------------------------------------


def prepare_trial_dir(path: Path) -> Path:
    if path.is_symlink():  # planted: the link goes, never what it points to
        path.unlink()
    elif path.exists():  # an interrupted earlier attempt: its files would read as ours
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def run_job(job: JobSpec, on_events: OnEvents | None = None, poll_s: float = WATCH_POLL_S,
            env: dict[str, str | None] | None = None) -> TrialRecord:
    """Run `job` to its verdict (see the module docstring); job.spec.out_dir is the trial
    directory (created, emptied). `env` changes the child's environment (None removes a
    variable)."""
    job = job.validate()
    spec = job.spec
    trial_dir = prepare_trial_dir(Path(spec.out_dir))
    job_path = write_text(trial_dir / "job.json", job.to_json())
    write_text(trial_dir / "spec.json", spec.to_json())
    names = ["main"] if job.world_size == 1 else [f"rank-{r}" for r in range(job.world_size)]
    dirs = {name: trial_dir if name == "main" else trial_dir / name for name in names}
    streams = [Stream(name, dirs[name] / "events.jsonl", spec.steps) for name in names]
    watcher = Watcher(streams, spec.stall_timeout_s, spec.budget_s,
                      startup_grace_s=spec.startup_grace_s)
    oom_kills_before, load_before = cgroup_oom_kills(), machine_load()
    with create_file(trial_dir / "stdout.txt") as out, \
            create_file(trial_dir / "stderr.txt") as err:
        launched = Launched(child_command(job, job_path), child_env(job, trial_dir, env),
                            out, err)
    started = time.time()
    capture = _Capture(None, {}, None)
    others: list[psutil.Process] = []
    clocks: dict[str, list[tuple[float, float, float]]] = {}  # name -> [first, latest]
    decided_at = None  # when the watcher said stop: capturing evidence takes seconds more,
    # and py-spy pauses the process meanwhile, so that time is not the run's
    try:
        while launched.poll() is None:
            stop.check()
            events = watcher.read()
            _read_clocks(streams, clocks)
            if events and on_events:
                on_events([e for e in events if e.get("kind") != "pulse"] or events[-1:])
            due = watcher.due()
            if due is not None:
                decided_at = time.time()
                pids = {s.name: s.pid for s in streams if s.pid}
                if due.reason == "stall" and job.world_size > 1 and job.ddp_backend == "nccl":
                    flight_recorder.request_dumps([dirs[n] for n in names])
                others = unwatched(launched, set(pids.values())) if due.reason == "stall" \
                    else []
                capture = _Capture(due, capture_all(pids, dirs, due, spec.stall_timeout_s,
                                                    others), gpu_state())
                if due.reason == "stall" and job.world_size > 1 and job.ddp_backend == "nccl":
                    time.sleep(2.0)  # the ranks' dump threads write within a poll or two
                break
            time.sleep(poll_s)
    finally:
        ended_at = decided_at or time.time()
        _read_clocks(streams, clocks)
        launched.kill_all()
    watcher.read()
    load = _load(load_before, clocks)
    capture.others = others_evidence(others, capture.stalls)
    return _record(job, trial_dir, streams, launched.proc.returncode, capture, started,
                   ended_at, load, _oom(oom_kills_before, cgroup_oom_kills()))


def _read_clocks(streams: list[Stream],
                 clocks: dict[str, list[tuple[float, float, float]]]) -> None:
    """Keep the first and the latest (time, on-CPU, run-queue) reading of every process's
    main thread."""
    for stream in streams:
        clock = _thread_clock(stream.pid) if stream.pid else None
        if clock is not None:
            reading = (time.monotonic(), *clock)
            clocks.setdefault(stream.name, [reading, reading])[1] = reading


def _load(before: dict[str, Any],
          clocks: dict[str, list[tuple[float, float, float]]]) -> dict[str, Any]:
    """The machine's load at start and end, and each process's main-thread CPU use over its
    life: share (on-CPU / wall), demand ((on-CPU + run-queue) / wall) and got (on-CPU /
    (on-CPU + run-queue): how much of the CPU it asked for it received)."""
    use = {}
    for name, (start, end) in clocks.items():
        wall_s = end[0] - start[0]
        if wall_s <= 0:
            continue
        cpu, runq = end[1] - start[1], end[2] - start[2]
        use[name] = {"wall_s": wall_s, "cpu_s": cpu, "runq_s": runq, "cpu_share": cpu / wall_s,
                     "demand": (cpu + runq) / wall_s,
                     "got": cpu / (cpu + runq) if cpu + runq > 0 else None}
    return {"start": before, "end": machine_load(), "main_thread": use}


def _oom(before: int | None, after: int | None) -> bool:
    return before is not None and after is not None and after > before


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def profile_summary(path: Path) -> dict[str, Any] | None:
    """The summary of the child's sampled profile; its stacks also go to profile.folded
    beside it, for a flame-graph viewer."""
    profile = read_profile(path)
    if not profile:
        return None
    try:
        write_text(path.with_suffix(".folded"), folded(profile), reserve=False)
    except ValueError:
        pass  # the summary still reaches the verdict; the file is a convenience
    return summarize_profile(profile)


def _record(job: JobSpec, trial_dir: Path, streams: list[Stream], returncode: int | None,
            capture: _Capture, started: float, ended_at: float, load: dict[str, Any],
            oom_killer: bool) -> TrialRecord:
    spec = job.spec
    wall_s = ended_at - started
    reason = capture.due.reason if capture.due else None
    outcome = outcome_of(returncode, reason, wall_s, ended_at, spec.memory_cap_bytes,
                         oom_killer)
    results = {s.name: _read_json(s.path.parent / "result.json") for s in streams}
    for stream in streams:
        stall = capture.stalls.get(stream.name)
        if stall is not None:  # every event written before the kill has been read by now
            stall.unfinished_backward = stream.backward.modules()
    first = streams[0]
    result = results[first.name]
    stderr_path = trial_dir / "stderr.txt"
    evidence = Evidence(spec=json.loads(spec.to_json()), events=list(first.last),
                        event_counts=dict(first.counts), result=result, outcome=outcome,
                        stall=capture.stalls.get(first.name),
                        expected_events_per_step=(result or {}).get("expected_events_per_step"),
                        total_steps=spec.steps, stall_timeout_s=spec.stall_timeout_s,
                        pulses=list(first.pulses), load=load,
                        profile=profile_summary(first.path.parent / "profile.json"),
                        thread_exceptions=thread_exceptions.read(
                            first.path.parent / thread_exceptions.FILE_NAME),
                        others=capture.others,
                        crash=crash.read(first.path.parent, stderr_path, first.pid)
                        if outcome.signal is not None and not outcome.killed_by_runner
                        else None)
    if job.world_size == 1:
        verdict = decide(evidence)
        data = evidence.to_dict()
    else:
        ranks = [rank_evidence(i, s, results[s.name], capture.stalls.get(s.name),
                               None if outcome.killed_by_runner else stderr_path)
                 for i, s in enumerate(streams)]
        verdict = decide_ranks(evidence, ranks)
        data = evidence.to_dict()
        data["ranks"] = [r.to_dict() for r in ranks]
        data["ddp"] = {"world_size": job.world_size, "backend": job.ddp_backend,
                       "pg_timeout_s": job.pg_timeout_s or pg_timeout_for(spec.stall_timeout_s),
                       "flight_recorder": flight_recorder.collect(trial_dir)}
    data["job"] = {"kind": job.kind, "check": job.check, "world_size": job.world_size}
    with contextlib.suppress(ValueError):  # a copy only: the record keeps the evidence
        write_json(trial_dir / "evidence.json", data, reserve=False)
    return TrialRecord(spec=data["spec"], evidence=data, verdict=verdict.to_dict(),
                       trial_dir=str(trial_dir), wall_s=wall_s, gpu=capture.gpu)


def rank_evidence(rank: int, stream: Stream, result: dict[str, Any] | None,
                  stall: StallEvidence | None, stderr_path: Path | None = None
                  ) -> RankEvidence:
    """What the parent saw of one rank, for nsadiag.verdict.ranks; with ``stderr_path``
    (the job's stderr) what the rank left if it died without a result
    (nsadiag.harness.crash)."""
    state = frames.classify(stall.samples) if stall and stall.samples else None
    signature = frames.stack_signature(stall.samples[-1]) if stall and stall.samples else ""
    started = [e for e in stream.collectives if e.get("edge") == "start"]
    return RankEvidence(rank=rank, pid=stream.pid or (result or {}).get("pid"),
                        events=list(stream.last), event_counts=dict(stream.counts),
                        result=result, started=started[-STARTED_KEEP:],
                        collectives=summarize(stream.collectives), stall=stall, state=state,
                        signature=signature,
                        crash=crash.read(stream.path.parent, stderr_path, stream.pid)
                        if result is None and stderr_path is not None else None,
                        thread_exceptions=thread_exceptions.read(
                            stream.path.parent / thread_exceptions.FILE_NAME))


# ---- the shapes of job the commands run ------------------------------------------------------


def run_trial(spec: TrialSpec, on_events: OnEvents | None = None) -> TrialRecord:
    """One single-process training trial (spec.out_dir is the trial directory)."""
    return run_job(JobSpec("trial", spec), on_events)


def run_ddp_trial(spec: TrialSpec, world_size: int, backend: str = "gloo",
                  pg_timeout_s: float | None = None,
                  on_events: OnEvents | None = None) -> TrialRecord:
    """One training trial of `world_size` ranks under torchrun."""
    return run_job(JobSpec("trial", spec, world_size=world_size, ddp_backend=backend,
                           pg_timeout_s=pg_timeout_s), on_events)


def run_check_job(name: str, spec: TrialSpec, world_size: int = 1,
                  ddp_backend: str = "gloo") -> TrialRecord:
    """One correctness check in a watched child (the ddp check on `world_size` ranks)."""
    return run_job(JobSpec("check", spec, world_size=world_size, ddp_backend=ddp_backend,
                           check=name))
