"""nsadiag ddp: one trial under torchrun with N ranks, watched per rank, decided across ranks.

`run_ddp_trial(spec, world_size, backend)` launches

    python -m torch.distributed.run --standalone --nproc-per-node N -m nsadiag.ddp_trial
        <trial_dir>/spec.json BACKEND PG_TIMEOUT_S

in its own process group and follows every rank's heartbeat file (<trial_dir>/rank-<r>/).
The clocks are nsadiag.runner's, over all ranks together: no event from any rank for
spec.stall_timeout_s (STARTUP_GRACE_S before the first forward) -> capture stall evidence
of every rank at once (py-spy samples, CPU time, faulthandler; with NCCL a Flight Recorder
dump) and stop; spec.budget_s of wall time -> a few samples per rank for the hot frame, and
stop. The process-group timeout handed to the ranks is `pg_timeout_for(stall timeout)`:
long enough that the runner sees a stall and samples it first, short enough that a
collective that never completes ends in minutes, never the default 30.

torchrun starts each rank in a session of its own, so killing the launcher's group is not
enough: every rank PID seen (from the launcher's process tree and from the ranks' result
files) is killed too, on every path out, and the runner waits until they are gone.

The record is a nsadiag.runner.TrialRecord: its evidence is the job's Evidence (the
launcher's outcome; rank 0's events) plus "ranks" (RankEvidence of each) and "ddp"
(world_size, backend, pg_timeout_s, flight_recorder dumps); its verdict comes from
nsadiag.verdict.ranks.decide_ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from nsadiag.collectives import summarize
from nsadiag.commands.stacks import _signature as stack_signature
from nsadiag.commands.sweep import check_target
from nsadiag.evidence import Evidence, StallEvidence
from nsadiag.probes import flight_recorder, frames
from nsadiag.probes.gpu import gpu_state
from nsadiag.processes import rank_pids
from nsadiag.rundir import TrialRecord, append_record, prepare_run_dir
from nsadiag.runner import (
    KEEP_EVENTS,
    STARTUP_GRACE_S,
    EventTail,
    _outcome,
    _Watch,
    capture_stall,
    kill_group,
    sample_stacks,
)
from nsadiag.spec import TrialSpec
from nsadiag.verdict.ranks import STARTED_KEEP, RankEvidence, decide_ranks

BACKENDS = ("gloo", "nccl")
SAMPLE_TIMEOUT_S = 15.0
"""Per py-spy sample of a rank: a native dump of a process with libtorch's symbols and a
process group's threads takes seconds on a busy machine."""


def pg_timeout_for(stall_timeout_s: float) -> float:
    """Process-group timeout for a stall timeout: the runner's detection (stall timeout)
    plus its sampling of all ranks in parallel (a window of at most 6 s, and py-spy runs of
    up to SAMPLE_TIMEOUT_S each) fit inside it."""
    return 2.0 * stall_timeout_s + 60.0


def check_ddp(spec: TrialSpec, world_size: int, backend: str) -> None:
    """ValueError (one line) for a world size, backend or device that cannot run here."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world-size: must be an integer >= 1, got {world_size!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "gloo":
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError("backend: nccl needs CUDA, and torch.cuda.is_available() is False "
                         "on this machine; use --backend gloo")
    if spec.device == "cpu":
        raise ValueError("device: nccl runs on CUDA tensors; use --device cuda or auto")
    if world_size > torch.cuda.device_count():
        raise ValueError(f"world-size: nccl needs one GPU per rank, and this machine has "
                         f"{torch.cuda.device_count()} (asked for {world_size})")


def _launch(trial_dir: Path, spec_path: Path, world_size: int, backend: str,
            pg_timeout_s: float) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONUNBUFFERED": "1"}
    if backend == "nccl":
        env.update(flight_recorder.child_env(trial_dir))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(world_size), "-m", "nsadiag.ddp_trial", str(spec_path),
               backend, f"{pg_timeout_s:g}"]
    with open(trial_dir / "stdout.txt", "wb") as out, open(trial_dir / "stderr.txt", "wb") as err:
        return subprocess.Popen(command, stdout=out, stderr=err, env=env,
                                start_new_session=True)


class _Ranks:
    """The parent's view of every rank: heartbeat tails, watches, collective events, pids."""

    def __init__(self, trial_dir: Path, world_size: int):
        self.dirs = [trial_dir / f"rank-{r}" for r in range(world_size)]
        self.tails = [EventTail(d / "events.jsonl") for d in self.dirs]
        self.watches = [_Watch() for _ in self.dirs]
        self.started: list[list[dict[str, Any]]] = [[] for _ in self.dirs]
        self.collective_events: list[list[dict[str, Any]]] = [[] for _ in self.dirs]
        self.pids: dict[int, int] = {}

    def read(self) -> list[dict[str, Any]]:
        new = []
        for rank, (tail, watch) in enumerate(zip(self.tails, self.watches, strict=True)):
            events = tail.read_new()
            watch.add(events)
            for event in events:
                if event.get("kind") == "collective":
                    self.collective_events[rank].append(event)
                    if event.get("edge") == "start":
                        self.started[rank].append(event)
            new += events
        return new

    def last_arrival(self) -> float:
        return max(w.last_arrival for w in self.watches)

    def started_training(self) -> bool:
        return any(w.started_training for w in self.watches)

    def find_pids(self, launcher_pid: int) -> None:
        """Rank PIDs from the launcher's process tree (see nsadiag.processes.rank_pids)."""
        self.pids.update(rank_pids(launcher_pid))


def _capture_all(ranks: _Ranks, quiet: float, window: float) -> dict[int, StallEvidence]:
    """Stall evidence of every rank, sampled at the same time (one thread per rank)."""
    found: dict[int, StallEvidence] = {}

    def one(rank: int, pid: int) -> None:
        found[rank] = capture_stall(pid, quiet, window,
                                    ranks.dirs[rank] / "faulthandler.txt",
                                    timeout_s=SAMPLE_TIMEOUT_S)

    threads = [threading.Thread(target=one, args=(rank, pid)) for rank, pid in
               ranks.pids.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found


def _samples_all(ranks: _Ranks, quiet: float) -> dict[int, StallEvidence]:
    found: dict[int, StallEvidence] = {}
    for rank, pid in ranks.pids.items():
        samples, unavailable = sample_stacks(pid, 2, 0.5, timeout_s=SAMPLE_TIMEOUT_S)
        found[rank] = StallEvidence(since_last_event_s=quiet, window_s=1.0, cpu_delta_s=None,
                                    samples=samples, unavailable=unavailable)
    return found


def _kill_all(proc: subprocess.Popen, pids: Sequence[int]) -> None:
    """SIGKILL every rank (each in its own session) and the launcher's group; wait until
    the ranks are gone."""
    alive = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            process.send_signal(signal.SIGKILL)
            alive.append(process)
        except psutil.NoSuchProcess:
            continue
    kill_group(proc)
    psutil.wait_procs(alive, timeout=10)


def _result_of(rank_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((rank_dir / "result.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _state(stall: StallEvidence | None) -> tuple[str | None, str]:
    if stall is None or not stall.samples:
        return None, ""
    return frames.classify(stall.samples), stack_signature(stall.samples[-1])


def run_ddp_trial(spec: TrialSpec, world_size: int, backend: str = "gloo",
                  pg_timeout_s: float | None = None,
                  on_events: Callable[[list[dict]], None] | None = None,
                  poll_s: float = 0.2) -> TrialRecord:
    """Run one DDP trial of `world_size` ranks to its verdict; spec.out_dir is the trial
    directory (created, emptied). Raises ValueError for options that cannot run here."""
    spec = spec.validate()
    check_ddp(spec, world_size, backend)
    pg_timeout_s = pg_timeout_for(spec.stall_timeout_s) if pg_timeout_s is None else \
        float(pg_timeout_s)
    if not pg_timeout_s > 0:
        raise ValueError(f"pg-timeout: must be > 0 seconds, got {pg_timeout_s:g}")
    trial_dir = Path(spec.out_dir)
    if trial_dir.exists():
        shutil.rmtree(trial_dir)
    trial_dir.mkdir(parents=True)
    spec_path = trial_dir / "spec.json"
    spec_path.write_text(spec.to_json())
    ranks = _Ranks(trial_dir, world_size)
    proc = _launch(trial_dir, spec_path, world_size, backend, pg_timeout_s)
    started, started_mono = time.time(), time.monotonic()
    stalls: dict[int, StallEvidence] = {}
    reason, gpu, next_scan = None, None, 0.0
    try:
        while proc.poll() is None:
            now = time.monotonic()
            if len(ranks.pids) < world_size and now >= next_scan:
                ranks.find_pids(proc.pid)
                next_scan = now + 0.5
            events = ranks.read()
            if events and on_events:
                on_events(events)
            quiet = now - ranks.last_arrival()
            limit = spec.stall_timeout_s if ranks.started_training() else \
                max(spec.stall_timeout_s, STARTUP_GRACE_S)
            if quiet > limit:
                ranks.find_pids(proc.pid)
                window = min(max(1.5, spec.stall_timeout_s / 2), 6.0)
                if backend == "nccl":
                    flight_recorder.request_dumps(ranks.dirs)
                stalls = _capture_all(ranks, quiet, window)
                if backend == "nccl":
                    time.sleep(2.0)  # the ranks' dump threads write within a poll or two
                gpu, reason = gpu_state(), "stall"
                break
            if now - started_mono > spec.budget_s:
                ranks.find_pids(proc.pid)
                stalls = _samples_all(ranks, quiet)
                gpu, reason = gpu_state(), "budget"
                break
            time.sleep(poll_s)
    finally:
        ended_at = time.time()
        ranks.find_pids(proc.pid)  # a rank that started after the last scan
        results = [_result_of(d) for d in ranks.dirs]
        pids = set(ranks.pids.values()) | {r["pid"] for r in results if r and r.get("pid")}
        _kill_all(proc, sorted(pids))
    return _record(spec, trial_dir, ranks, proc, reason, started, ended_at, stalls, gpu,
                   world_size, backend, pg_timeout_s)


def _record(spec: TrialSpec, trial_dir: Path, ranks: _Ranks, proc: subprocess.Popen,
            reason: str | None, started: float, ended_at: float,
            stalls: dict[int, StallEvidence], gpu: Any, world_size: int, backend: str,
            pg_timeout_s: float) -> TrialRecord:
    ranks.read()
    wall_s = ended_at - started
    evidence_ranks = []
    for rank, rank_dir in enumerate(ranks.dirs):
        result = _result_of(rank_dir)
        stall = stalls.get(rank)
        state, signature = _state(stall)
        watch = ranks.watches[rank]
        evidence_ranks.append(RankEvidence(
            rank=rank, pid=ranks.pids.get(rank) or (result or {}).get("pid"),
            events=list(watch.last), event_counts=dict(watch.counts), result=result,
            started=ranks.started[rank][-STARTED_KEEP:],
            collectives=summarize(ranks.collective_events[rank]), stall=stall, state=state,
            signature=signature))
    first = evidence_ranks[0] if evidence_ranks else None
    job = Evidence(spec=json.loads(spec.to_json()), events=first.events if first else [],
                   event_counts=first.event_counts if first else {},
                   result=first.result if first else None,
                   outcome=_outcome(proc, reason, wall_s, ended_at, spec.memory_cap_bytes),
                   stall=first.stall if first else None,
                   expected_events_per_step=(first.result or {}).get(
                       "expected_events_per_step") if first else None,
                   total_steps=spec.steps, stall_timeout_s=spec.stall_timeout_s)
    verdict = decide_ranks(job, evidence_ranks)
    evidence = job.to_dict()
    evidence["events"] = evidence["events"][-KEEP_EVENTS:]
    evidence["ranks"] = [r.to_dict() for r in evidence_ranks]
    evidence["ddp"] = {"world_size": world_size, "backend": backend,
                       "pg_timeout_s": pg_timeout_s,
                       "flight_recorder": flight_recorder.collect(trial_dir)}
    (trial_dir / "evidence.json").write_text(json.dumps(evidence, indent=1))
    return TrialRecord(spec=evidence["spec"], evidence=evidence, verdict=verdict.to_dict(),
                       trial_dir=str(trial_dir), wall_s=wall_s, gpu=gpu)


def ddp_command(base: TrialSpec, world_size: int, backend: str, run_dir: Path,
                argv: Sequence[str], pg_timeout_s: float | None = None,
                on_events: Callable[[list[dict]], None] | None = None) -> Path:
    """Check, run one DDP trial into run_dir/trial-0, keep its record, render the report;
    returns the report path."""
    from nsadiag.envinfo import collect_env
    from nsadiag.report import render_run

    check_ddp(base, world_size, backend)
    check_target(base)
    prepare_run_dir(run_dir)
    meta = {"command_name": "ddp", "argv": list(argv), "env": collect_env().as_dict(),
            "world_size": world_size, "backend": backend}
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    (run_dir / "spec.json").write_text(base.to_json())
    trials = run_dir / "trials.jsonl"
    if trials.exists():
        trials.unlink()  # one trial per run: a rerun replaces it
    record = run_ddp_trial(base.replace(out_dir=str(run_dir / "trial-0")), world_size,
                           backend, pg_timeout_s=pg_timeout_s, on_events=on_events)
    append_record(trials, record)
    return render_run(run_dir)
