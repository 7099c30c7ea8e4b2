"""Run one job to its verdict: launch its child, watch it, capture evidence, stop it, decide.

``run_job(job)`` starts ``python -m nsadiag.harness.child job.json`` (under torchrun for a
ranked job: world_size > 1 or a DDP trial of one rank, each rank writing
<trial_dir>/rank-<r>/) in a session of its own and watches it with the one parent loop
(nsadiag.harness.session): at a stall or the budget every process is captured at once
(nsadiag.harness.capture; with NCCL also a Flight Recorder dump of every rank), then every
process of the job is killed, on every path out (Ctrl-C included), including those that
left its session (nsadiag.harness.launch; a reaper process does it if nsadiag itself dies).
The record (nsadiag.harness.record) is the Evidence of the job (for a ranked job, also each
rank's RankEvidence, decided across ranks), the verdict, and the trial directory.
``run_trial``, ``run_ddp_trial`` and ``run_check_job`` are the three shapes of job the
commands run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil

from nsadiag.evidence import DdpFacts, JobFacts
from nsadiag.harness.capture import unwatched
from nsadiag.harness.interrupted import interrupted_verdict
from nsadiag.harness.launch import Launched
from nsadiag.harness.machine import cgroup_oom_kills
from nsadiag.harness.record import build_record, outcome_of
from nsadiag.harness.session import Interrupted, OnEvents, SessionEnd, Tree, watch_session
from nsadiag.harness.streams import Due, Stream
from nsadiag.harness.times import WatchTimes
from nsadiag.probes import flight_recorder
from nsadiag.rundir import TrialRecord, create_file, write_text
from nsadiag.spec import WATCH_POLL_S, JobSpec, TrialSpec
from nsadiag.store.owned import remove_tree_of_ours

FLIGHT_RECORDER_WAIT_S = 2.0
"""After a stall's capture, the ranks' dump threads write their Flight Recorder dumps
within a poll or two."""


# ---- launching -------------------------------------------------------------------------------


def child_command(job: JobSpec, job_path: Path) -> list[str]:
    """The command line of the job's child (torchrun for a ranked job)."""
    child = ["-m", "nsadiag.harness.child", str(job_path)]
    if not job.ranked:
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
    if job.ranked:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    if job.ranked and job.ddp_backend == "nccl":
        env.update(flight_recorder.child_env(trial_dir))
    return env


# ---- running -----------------------------------------------------------------------------


def prepare_trial_dir(path: Path) -> Path:
    """A trial's directory, empty: what an interrupted earlier attempt left there would
    read as this trial's, so nsadiag's files in it go (a planted link only as a name);
    OSError naming anything else found there, which is kept."""
    remove_tree_of_ours(path)
    path.mkdir(parents=True)
    return path


def job_times(job: JobSpec, poll_s: float = WATCH_POLL_S) -> WatchTimes:
    """The times a job is watched under, from its spec."""
    spec = job.spec
    return WatchTimes(spec.stall_timeout_s, spec.budget_s, spec.startup_grace_s,
                      job.pg_timeout_s, poll_s)


class _JobTree(Tree):
    """A launched job: its rank streams known from the start, its processes killed at the
    end, and with NCCL each rank's Flight Recorder dumped at a stall."""

    def __init__(self, job: JobSpec, launched: Launched, streams: list[Stream]):
        super().__init__(streams)
        self.launched = launched
        self.rank_dirs = [stream.path.parent for stream in streams]
        self.nccl = job.ranked and job.ddp_backend == "nccl"

    def running(self) -> bool:
        return self.launched.poll() is None

    def unwatched(self, watched: set[int]) -> list[psutil.Process]:
        return unwatched(self.launched, watched)

    def before_capture(self, due: Due) -> None:
        if due.reason == "stall" and self.nccl:
            flight_recorder.request_dumps(self.rank_dirs)

    def after_capture(self, due: Due) -> None:
        if due.reason == "stall" and self.nccl:
            time.sleep(FLIGHT_RECORDER_WAIT_S)

    def stop(self) -> None:
        self.launched.kill_all()


def run_job(job: JobSpec, on_events: OnEvents | None = None, poll_s: float = WATCH_POLL_S,
            env: dict[str, str | None] | None = None) -> TrialRecord:
    """Run `job` to its verdict (see the module docstring); job.spec.out_dir is the trial
    directory (created, emptied). `env` changes the child's environment (None removes a
    variable)."""
    job = job.validate()
    spec = job.spec
    times = job_times(job, poll_s)
    trial_dir = prepare_trial_dir(Path(spec.out_dir))
    job_path = write_text(trial_dir / "job.json", job.to_json())
    write_text(trial_dir / "spec.json", spec.to_json())
    names = [f"rank-{r}" for r in range(job.world_size)] if job.ranked else ["main"]
    streams = [Stream(name, (trial_dir if name == "main" else trial_dir / name) /
                      "events.jsonl", spec.steps) for name in names]
    oom_kills_before = cgroup_oom_kills()
    with create_file(trial_dir / "stdout.txt") as out, \
            create_file(trial_dir / "stderr.txt") as err:
        launched = Launched(child_command(job, job_path), child_env(job, trial_dir, env),
                            out, err)
    try:
        end = watch_session(_JobTree(job, launched, streams), times, on_events)
    except Interrupted as stopped:  # the trial so far, for the sweep to keep
        record = _record(job, times, trial_dir, stopped.end, launched.proc.returncode, False)
        record.verdict = interrupted_verdict(record.verdict, stopped.end, stopped.end.streams[0])
        if record.evidence is not None:
            record.evidence.interrupted = record.verdict.facts.position.interrupted
        raise TrialInterrupted(record) from None
    return _record(job, times, trial_dir, end, launched.proc.returncode,
                   _oom(oom_kills_before, cgroup_oom_kills()))


class TrialInterrupted(KeyboardInterrupt):
    """A job the user interrupted: ``record`` is what it had found (its verdict
    INCONCLUSIVE, or the one decided before the stop; nsadiag.harness.interrupted)."""

    def __init__(self, record: TrialRecord):
        super().__init__()
        self.record = record


def _oom(before: int | None, after: int | None) -> bool:
    return before is not None and after is not None and after > before


def _record(job: JobSpec, times: WatchTimes, trial_dir: Path, end: SessionEnd,
            returncode: int | None, oom_killer: bool) -> TrialRecord:
    spec = job.spec
    reason = end.reason or ("interrupted" if end.interrupted_at is not None else None)
    outcome = outcome_of(returncode, reason, end.wall_s, end.ended_at,
                         spec.memory_cap_bytes, oom_killer)
    ddp = None
    if job.ranked:
        ddp = DdpFacts(job.world_size, job.ddp_backend, times.pg_timeout_s,
                       times.collective_outlasts_capture(),
                       flight_recorder.collect(trial_dir))
    ranks = dict(enumerate(end.streams)) if job.ranked else {}
    return build_record(json.loads(spec.to_json()), trial_dir, end, end.streams[0], ranks,
                        outcome, ended_ok=end.due is None and returncode == 0,
                        total_steps=spec.steps, ddp=ddp,
                        job=JobFacts(job.kind, job.check, job.world_size))


# ---- the shapes of job the commands run ------------------------------------------------------


def run_trial(spec: TrialSpec, on_events: OnEvents | None = None) -> TrialRecord:
    """One single-process training trial (spec.out_dir is the trial directory)."""
    return run_job(JobSpec("trial", spec), on_events)


def run_ddp_trial(spec: TrialSpec, world_size: int, backend: str = "gloo",
                  pg_timeout_s: float | None = None,
                  on_events: OnEvents | None = None) -> TrialRecord:
    """One training trial of `world_size` ranks under torchrun (one rank too: DDP and its
    collectives are what a DDP trial watches, and one GPU holds only one NCCL rank)."""
    return run_job(JobSpec("trial", spec, world_size=world_size, torchrun=True,
                           ddp_backend=backend, pg_timeout_s=pg_timeout_s), on_events)


def run_check_job(name: str, spec: TrialSpec, world_size: int = 1,
                  ddp_backend: str = "gloo") -> TrialRecord:
    """One correctness check in a watched child (the ddp check on `world_size` ranks)."""
    return run_job(JobSpec("check", spec, world_size=world_size, ddp_backend=ddp_backend,
                           check=name))
