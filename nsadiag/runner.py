"""The parent side of a trial: launch, watch, capture evidence, kill, decide.

`run_trial(spec)` starts `python -m nsadiag.trial spec.json` in its own process group and
follows its heartbeat file. Two clocks decide when to stop it:
  stall   no new heartbeat event for spec.stall_timeout_s (at least STARTUP_GRACE_S before
          the first forward event): capture stall evidence (several
          py-spy samples spaced apart, the process CPU-time delta over the same window, a
          faulthandler dump), then kill the group.
  budget  spec.budget_s of wall time while events still arrive: take stack samples for the
          hot frame, then kill the group. The verdict is then SLOW with a rate and an ETA.
Nothing of the trial outlives `run_trial`: the whole process group is killed on every
path out, Ctrl-C included. The record (spec, evidence, verdict) is returned; `append_record`
adds it to trials.jsonl with an fsync so a rerun can resume after the last finished trial.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nsadiag.evidence import Evidence, ProcessOutcome, StackSample, StallEvidence
from nsadiag.heartbeat import OpenBackward
from nsadiag.probes import frames, stacks
from nsadiag.probes.gpu import gpu_state
from nsadiag.rundir import TrialRecord
from nsadiag.spec import TrialSpec
from nsadiag.verdict.rules import Verdict, decide

KEEP_EVENTS = 400  # the last events kept as evidence
STACK_SAMPLES = 3
# Starting Python, importing torch and building the model emit (almost) no events and
# take seconds; until the first forward event the silence limit is at least this long.
STARTUP_GRACE_S = 30.0




class EventTail:
    """Reads the complete lines appended to a JSONL file since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn line from a killed writer carries nothing reliable
        return events


class _Watch:
    """What the parent has seen of the child so far."""

    def __init__(self):
        self.last: deque[dict[str, Any]] = deque(maxlen=KEEP_EVENTS)
        self.counts: Counter[str] = Counter()
        self.last_arrival = time.monotonic()
        self.step0_module_events = 0
        self.step0_done = False
        self.started_training = False
        self.backward = OpenBackward()

    def add(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self.last.append(event)
            self.backward.add(event)
            self.counts[event.get("kind", "?")] += 1
            if event.get("kind") == "module" and event.get("step") == 0:
                self.step0_module_events += 1
            if event.get("kind") == "step" and event.get("step") == 0:
                self.step0_done = True
            if event.get("phase") == "forward":
                self.started_training = True
        if events:
            self.last_arrival = time.monotonic()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group and reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def sample_stacks(pid: int, count: int, interval_s: float, *, timeout_s: float | None = None,
                  faulthandler_file: Path | None = None) -> tuple[list[StackSample], list[str]]:
    """`count` samples `interval_s` apart (py-spy with native frames when it can, else the
    faulthandler dump into `faulthandler_file`), and the reasons for any sample that could
    not be taken. `timeout_s` bounds each sample (default: max(5 s, 4 intervals))."""
    samples, unavailable = [], []
    for i in range(count):
        if i:
            time.sleep(interval_s)
        limit = timeout_s if timeout_s is not None else max(5.0, interval_s * 4)
        taken = stacks.capture(pid, native=True, timeout_s=limit,
                               faulthandler_file=faulthandler_file)
        if isinstance(taken, str):
            unavailable.append(taken)
        else:
            samples.append(taken)
    return samples, sorted(set(unavailable))


def capture_stall(pid: int, since_last_event_s: float, window_s: float,
                  faulthandler_path: Path, timeout_s: float | None = None) -> StallEvidence:
    """Stack samples spread over `window_s`, the CPU time the process used meanwhile, and a
    faulthandler dump of all threads into `faulthandler_path` (SIGUSR1, sent only when the
    child has its handler installed; the samples themselves come from it when py-spy
    cannot attach)."""
    cpu_before = stacks.process_cpu_seconds(pid)
    started = time.monotonic()
    samples, unavailable = sample_stacks(pid, STACK_SAMPLES, window_s / STACK_SAMPLES,
                                         timeout_s=timeout_s,
                                         faulthandler_file=faulthandler_path)
    elapsed = time.monotonic() - started
    cpu_after = stacks.process_cpu_seconds(pid)
    cpu_delta = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    if not any((s.note or "").startswith("stacks from faulthandler") for s in samples):
        dumped = stacks.faulthandler_capture(pid, faulthandler_path)  # only if registered
        if isinstance(dumped, str):
            unavailable.append(dumped)
    return StallEvidence(since_last_event_s=since_last_event_s, window_s=elapsed,
                         cpu_delta_s=cpu_delta, samples=samples, unavailable=unavailable,
                         stacks_class=frames.classify(samples) if samples else None)


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


def _oom_killed(before: int | None, after: int | None) -> bool:
    return before is not None and after is not None and after > before


def _outcome(proc: subprocess.Popen, reason: str | None, wall_s: float, ended_at: float,
             cap: int | None, oom_killer: bool = False) -> ProcessOutcome:
    code = proc.returncode
    if code is not None and code < 0:
        number = -code
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = None
        return ProcessOutcome(exit_code=None, signal=number, signal_name=name,
                              killed_by_runner=reason is not None, kill_reason=reason,
                              wall_s=wall_s, memory_cap_bytes=cap, ended_at=ended_at,
                              oom_killer=oom_killer and reason is None)
    return ProcessOutcome(exit_code=code, killed_by_runner=False, wall_s=wall_s,
                          memory_cap_bytes=cap, ended_at=ended_at)


def _read_result(trial_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((trial_dir / "result.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def run_trial(spec: TrialSpec, on_events: Callable[[list[dict]], None] | None = None,
              poll_s: float = 0.2, child: Sequence[str] = ("nsadiag.trial",)) -> TrialRecord:
    """Run one trial to its verdict. spec.out_dir is the trial directory (created).

    `child` is the module to run and its arguments before the spec path; any child that
    writes events.jsonl and result.json the way nsadiag.trial does can be watched (the
    correctness checks run as `nsadiag.checks.child NAME`)."""
    trial_dir = Path(spec.out_dir)
    if trial_dir.exists():  # an interrupted earlier attempt: its files would read as ours
        shutil.rmtree(trial_dir)
    trial_dir.mkdir(parents=True)
    spec_path = trial_dir / "spec.json"
    spec_path.write_text(spec.to_json())
    with open(trial_dir / "stdout.txt", "wb") as out, open(trial_dir / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", *child, str(spec_path)],
                                stdout=out, stderr=err, start_new_session=True)
    started, started_mono = time.time(), time.monotonic()
    oom_kills_before = cgroup_oom_kills()
    tail, watch = EventTail(trial_dir / "events.jsonl"), _Watch()
    stall, reason, gpu = None, None, None
    try:
        while proc.poll() is None:
            events = tail.read_new()
            watch.add(events)
            if events and on_events:
                on_events(events)
            now = time.monotonic()
            quiet = now - watch.last_arrival
            limit = spec.stall_timeout_s if watch.started_training else \
                max(spec.stall_timeout_s, STARTUP_GRACE_S)
            if quiet > limit:
                window = min(max(1.5, spec.stall_timeout_s / 2), 6.0)
                stall = capture_stall(proc.pid, quiet, window, trial_dir / "faulthandler.txt")
                gpu, reason = gpu_state(), "stall"
                break
            if now - started_mono > spec.budget_s:
                samples, unavailable = sample_stacks(
                    proc.pid, 2, 0.5, faulthandler_file=trial_dir / "faulthandler.txt")
                stall = StallEvidence(since_last_event_s=quiet, window_s=1.0, cpu_delta_s=None,
                                      samples=samples, unavailable=unavailable,
                                      stacks_class=frames.classify(samples) if samples
                                      else None)
                gpu, reason = gpu_state(), "budget"
                break
            time.sleep(poll_s)
    finally:
        ended_at = time.time()
        kill_group(proc)  # also when it exited: grandchildren, if any, share the group
    wall_s = ended_at - started
    oom_kills_after = cgroup_oom_kills()
    watch.add(tail.read_new())
    if stall is not None:  # every event written before the kill has been read by now
        stall.unfinished_backward = watch.backward.modules()
    result = _read_result(trial_dir)
    expected = (result or {}).get("expected_events_per_step") or (
        watch.step0_module_events if watch.step0_done else None)
    evidence = Evidence(spec=json.loads(spec.to_json()), events=list(watch.last),
                        event_counts=dict(watch.counts), result=result,
                        outcome=_outcome(proc, reason, wall_s, ended_at, spec.memory_cap_bytes,
                                         _oom_killed(oom_kills_before, oom_kills_after)),
                        stall=stall,
                        expected_events_per_step=expected, total_steps=spec.steps,
                        stall_timeout_s=spec.stall_timeout_s)
    verdict: Verdict = decide(evidence)
    (trial_dir / "evidence.json").write_text(json.dumps(evidence.to_dict(), indent=1))
    return TrialRecord(spec=evidence.spec, evidence=evidence.to_dict(),
                       verdict=verdict.to_dict(), trial_dir=str(trial_dir), wall_s=wall_s,
                       gpu=gpu)
