"""nsadiag attach PID: a live process (or every rank of a torchrun job) watched for a
window without restarting, pausing for long, or killing it: progressing, stuck (busy or
idle), or waiting in a collective.

``attach_command(pid, duration_s, ranks, run_dir, argv)`` samples each process over
``duration_s`` seconds, all processes at once: ``SAMPLES`` stack samples spread over the
window (py-spy's nonblocking dump, which does not pause the process; the faulthandler dump
when py-spy cannot attach and nsadiag armed the process's faulthandler: see
nsadiag.probes.stacks), the CPU time it used and its main thread's on-CPU and run-queue
time over the same window (nsadiag.harness.jobs.capture_stall), two native samples at the
end when its Python stacks did not move (py-spy pauses the process for those: what native
call the frozen line is in), and, for a process nsadiag already watches (under ``nsadiag run`` or
``nsadiag.watch()``: it holds its events.jsonl open), the heartbeat it wrote meanwhile.
With ``ranks``, the processes are the ranks under PID (torchrun or its agent; their RANK),
found as ``nsadiag stacks --ranks`` finds them.

Each process then reads as one of:

progressing             its heartbeat recorded progress in the window; or, without one
                        (or when its sampler did not pulse in the window), its Python
                        stacks changed between samples while it used CPU (verdict OK:
                        nothing stuck was seen);
waiting in a collective a thread sat in a collective in most samples (STALL-COLLECTIVE);
stuck (busy)            frozen stacks and busy CPU (STALL-BUSY, with the hot frame);
stuck (idle)            frozen stacks and idle CPU (DEADLOCK, with the wait frame).

The last three come from the verdict rules of every trial (nsadiag.verdict.rules) applied
to the window's evidence, the window standing in for the stall timeout. Without a
heartbeat, a loop that never ends but moves between lines reads as progressing: stacks
alone cannot tell it from work. Across ranks: all progressing is OK; any rank waiting in
a collective makes the job STALL-COLLECTIVE, naming each rank's collective and the frame
of its own code that issued it, and the rank(s) whose stacks no other rank shares when
the others agree (or, when only some wait, the ranks that do not wait: the others wait
for them); otherwise the verdict of the first stuck rank.

The run directory gets run.json, attach.json (every observation, samples included),
report.md and summary.json (redacted unless ``no_redact``); the exit code follows the
verdict as for every command (nsadiag.ci).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from nsadiag.envinfo import ptrace_permission
from nsadiag.evidence import Evidence, ProcessOutcome, StallEvidence
from nsadiag.harness.jobs import SAMPLE_TIMEOUT_S, capture_stall, sample_stacks
from nsadiag.harness.watch import PROGRESS_KINDS, EventTail
from nsadiag.probes import frames, stacks
from nsadiag.processes import can_attach, rank_processes
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.rundir import prepare_run_dir, write_json, write_run_meta
from nsadiag.verdict.rules import Verdict, busy_fraction, decide
from nsadiag.verdict.thresholds import IDLE_CPU_FRACTION

SAMPLES = 6
NATIVE_SAMPLES = 2
NATIVE_INTERVAL_S = 0.5
NATIVE_RESERVE = 0.25
NATIVE_RESERVE_S = 3.0
"""The last part of the window kept for the native samples: this share, at most this
long."""
NATIVE_DUMP_S = 0.3
"""About how long a native dump takes: the last one starts this long before the end."""
MIN_DURATION_S = 1.0
STATES = {"OK": "progressing", "STALL-COLLECTIVE": "waiting in a collective",
          "STALL-BUSY": "stuck (busy)", "DEADLOCK": "stuck (idle)"}
NO_HEARTBEAT = "no module heartbeat was recorded"


@dataclass
class Observation:
    """One process over the window: the evidence decided on (samples and CPU, see
    ``with_native_frames``), the heartbeat events it wrote meanwhile (None: it has no
    nsadiag heartbeat), every nonblocking sample of the window, and what it reads as."""

    pid: int
    rank: int | None
    cmdline: str
    stall: StallEvidence
    events: list[dict[str, Any]] | None
    window_samples: list[Any] = field(default_factory=list)
    verdict: Verdict | None = None
    user_frame: str | None = None
    collective_frame: str | None = None
    signature: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        name = self.verdict.name if self.verdict else "?"
        return STATES.get(name, name.lower())

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "cmdline": self.cmdline,
                "state": self.state, "verdict": self.verdict.to_dict() if self.verdict else None,
                "cpu_fraction": self.stall.cpu_fraction(), "user_frame": self.user_frame,
                "collective_frame": self.collective_frame, "signature": self.signature,
                "heartbeat_events": None if self.events is None else len(self.events),
                "stall": self.stall.to_dict(),
                "window_samples": [sample.to_dict() for sample in self.window_samples]}


def native_reserve(duration_s: float) -> float:
    """The end of the window kept for the native samples (NATIVE_RESERVE of it, at most
    NATIVE_RESERVE_S)."""
    return min(NATIVE_RESERVE_S, NATIVE_RESERVE * duration_s)


def observe(pid: int, rank: int | None, duration_s: float, samples: int = SAMPLES
            ) -> Observation:
    """Watch one process for `duration_s` (see the module docstring); never raises for a
    process that goes away (its evidence says what could not be taken). The samples are
    taken against a deadline, the nonblocking ones before the window's last part and the
    native ones in it, so the whole lasts about `duration_s` however slow py-spy is on a
    loaded machine (more by what a native dump takes beyond the window: a sample's time
    at most)."""
    ends = time.monotonic() + duration_s
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        cmdline = ""
    heartbeat = stacks.open_file_named(pid, "events.jsonl")
    tail = EventTail(heartbeat) if heartbeat is not None else None
    if tail is not None:
        tail.read_new()  # what it wrote before the window is not the window's
    sampling = duration_s - native_reserve(duration_s)
    window = capture_stall(pid, duration_s, sampling, None, timeout_s=SAMPLE_TIMEOUT_S,
                           count=samples, native=False, dump=False,
                           deadline=time.monotonic() + sampling)
    events = tail.read_new() if tail is not None else None
    stall = window if _progress_events(events or []) else \
        with_native_frames(pid, window, ends)
    observation = Observation(pid, rank, cmdline, stall, events,
                              window_samples=window.samples)
    observation.verdict = judge(observation, duration_s)
    found = frames.find_collective(stall.samples)
    own = frames.user_frame(stall.samples)
    observation.collective_frame = found[1].where() if found else None
    observation.user_frame = own[0].where() if own else None
    observation.signature = " | ".join(
        part for part in (observation.collective_frame, observation.user_frame) if part) or (
        frames.stack_signature(stall.samples[-1]) if stall.samples else "")
    return observation


def with_native_frames(pid: int, window: StallEvidence, ends: float | None = None
                       ) -> StallEvidence:
    """The window's evidence to decide on. When its Python stacks did not move (or none was
    taken), NATIVE_SAMPLES native samples are taken at its end (py-spy pauses the process
    for each), before ``ends`` (a time.monotonic() reading) when given, and decide together
    with the window's last two: what native call the frozen Python line sits in (a
    collective, a lock, a kernel). Moving stacks are kept as they are."""
    samples = window.samples
    if len(samples) >= 2 and frames.stacks_change(samples, python_only=True):
        return window
    left = None if ends is None else ends - time.monotonic()
    # what native call a frozen line sits in decides between a lock, a collective and a
    # kernel: one native sample is taken even when slow samples spent the window, and each
    # gets its full time (a first native dump of a big process reads its symbols)
    count = NATIVE_SAMPLES if left is None or left > NATIVE_DUMP_S * NATIVE_SAMPLES else 1
    interval = NATIVE_INTERVAL_S if left is None else \
        max(0.0, (left - NATIVE_DUMP_S) / max(NATIVE_SAMPLES - 1, 1))
    native, unavailable = sample_stacks(pid, count, interval, timeout_s=SAMPLE_TIMEOUT_S)
    taken = samples[-2:] + native
    return dataclasses.replace(window, samples=taken,
                               unavailable=sorted(set(window.unavailable + unavailable)),
                               stacks_class=frames.classify(taken) if taken else None)


def _progress_events(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("kind") in PROGRESS_KINDS or
            (e.get("kind") == "pulse" and e.get("progress"))]


def judge(observation: Observation, duration_s: float) -> Verdict:
    """What one process's window reads as (see the module docstring)."""
    stall = observation.stall
    samples = stall.samples
    moved = _progress_events(observation.events or [])
    fraction = busy_fraction(stall)
    cpu = (f"it used {stall.cpu_delta_s:.1f} s of CPU in {stall.window_s:.1f} s "
           f"({stall.cpu_fraction():.0%})" if stall.cpu_fraction() is not None else
           "its CPU time was unreadable")
    if moved:
        return Verdict("OK", [f"progressing: its nsadiag heartbeat recorded {len(moved)} "
                              f"events of progress in the {duration_s:g} s window; {cpu}"],
                       {"state": "progressing", "heartbeat_progress": len(moved)})
    # a heartbeat whose sampler pulsed in the window and saw no progress outranks moving
    # stacks: a spin over a few lines moves them, and more so on a loaded machine, where a
    # sample more often lands between two lines
    pulsed = any(e.get("kind") == "pulse" for e in observation.events or [])
    changed = not pulsed and len(samples) >= 2 and frames.stacks_change(samples,
                                                                          python_only=True)
    if changed and fraction is not None and fraction >= IDLE_CPU_FRACTION and \
            frames.find_collective(samples) is None:
        distinct = len({frames.stack_signature(s) for s in samples})
        reasons = [f"progressing: its Python stacks changed between samples ({distinct} "
                   f"different innermost frames in {len(samples)} samples over "
                   f"{duration_s:g} s) while {cpu}"]
        if observation.events is None:
            reasons.append("it has no nsadiag heartbeat, so a loop that never ends would "
                           "read the same; run it under `nsadiag run` to tell them apart")
        facts = {"state": "progressing", "distinct_stacks": distinct, "samples": len(samples)}
        hot = frames.hot_frame(samples)
        if hot is not None:
            facts["hot_frame"] = hot[0].where()
            reasons.append(f"hot frame {hot[0].where()} in {hot[1]} thread samples")
        return Verdict("OK", reasons, facts)
    evidence = Evidence(
        spec={"subject": "the process", "pid": observation.pid}, events=[],
        event_counts={}, result=None,
        outcome=ProcessOutcome(exit_code=None, killed_by_runner=True, kill_reason="stall",
                               wall_s=duration_s, ended_at=time.time()),
        stall=stall, expected_events_per_step=None, total_steps=0, stall_timeout_s=duration_s)
    verdict = decide(evidence)
    if observation.events is not None:
        verdict.reasons.insert(0, f"its nsadiag heartbeat recorded no progress in the "
                                  f"{duration_s:g} s window")
    verdict.reasons = [r for r in verdict.reasons if not r.startswith(NO_HEARTBEAT)]
    verdict.facts["state"] = STATES.get(verdict.name, verdict.name.lower())
    return verdict


def decide_job(observations: Sequence[Observation], duration_s: float) -> Verdict:
    """The verdict over the ranks of a job (see the module docstring)."""
    if len(observations) == 1:
        return observations[0].verdict
    rows = [{"rank": o.rank, "pid": o.pid, "state": o.state,
             "cpu_fraction": o.stall.cpu_fraction(), "collective": o.collective_frame,
             "user_frame": o.user_frame} for o in observations]
    if all(o.verdict.name == "OK" for o in observations):
        return Verdict("OK", [f"all {len(observations)} ranks progressing over the "
                              f"{duration_s:g} s window"], {"ranks": rows, "odd_ranks": []})
    waiting = [o for o in observations if o.verdict.name == "STALL-COLLECTIVE"]
    if not waiting:
        stuck = next(o for o in observations if o.verdict.name != "OK")
        return Verdict(stuck.verdict.name,
                       [f"rank {stuck.rank}: {r}" for r in stuck.verdict.reasons],
                       {**stuck.verdict.facts, "rank": stuck.rank, "ranks": rows})
    if len(waiting) < len(observations):
        odd = [o for o in observations if o not in waiting]
    else:
        odd = frames.odd_ones_out(observations, lambda o: o.signature)
    sentences = [_rank_sentence(o) for o in sorted(observations,
                                                   key=lambda o: (o not in odd, o.rank))]
    reasons = ["; ".join(sentences)]
    names = ", ".join(str(o.rank) for o in odd)
    if odd and len(waiting) < len(observations):
        reasons.append(f"rank(s) {names} do not wait in a collective while the others do: "
                       f"the others wait for them")
    elif odd:
        reasons.append(f"rank(s) {names} wait somewhere no other rank does")
    else:
        reasons.append("the ranks wait in different collectives; which one left the common "
                       "path cannot be told from stacks alone (run the job under `nsadiag "
                       "run` to count each rank's collectives)")
    return Verdict("STALL-COLLECTIVE", reasons,
                   {"ranks": rows, "odd_ranks": sorted(o.rank for o in odd),
                    "confidence": "high" if odd else "medium"})


def _rank_sentence(o: Observation) -> str:
    where = f", issued from {o.user_frame}" if o.user_frame else ""
    if o.collective_frame:
        return f"rank {o.rank} waits in {o.collective_frame}{where}"
    return f"rank {o.rank} is {o.state}" + (f" at {o.user_frame}" if o.user_frame else "")


def targets_of(pid: int, ranks: bool) -> list[tuple[int, int | None]]:
    """(pid, rank) of the processes to observe: PID, or the ranks under it; ValueError
    (one line) for a process that is missing or cannot be sampled."""
    if not psutil.pid_exists(pid):
        raise ValueError(f"pid: no process {pid}")
    targets = rank_processes(pid) if ranks else [(pid, None)]
    if ranks and any(rank is not None for _, rank in targets):
        targets = [(p, r) for p, r in targets if r is not None]
    permission = ptrace_permission()
    for target, _ in targets:
        can_attach(target, permission)
    return targets


def attach(pid: int, duration_s: float, ranks: bool = False, samples: int = SAMPLES
           ) -> tuple[Verdict, list[Observation]]:
    """Observe PID (or the ranks under it) for `duration_s`, all at once; the verdict and
    the observations. ValueError (one line) for a bad duration or what cannot be attached
    to."""
    _check_duration(duration_s)
    return observe_all(targets_of(pid, ranks), duration_s, samples)


def _check_duration(duration_s: float) -> None:
    if not duration_s >= MIN_DURATION_S:
        raise ValueError(f"duration: must be >= {MIN_DURATION_S:g} seconds, got "
                         f"{duration_s:g}")


def observe_all(targets: Sequence[tuple[int, int | None]], duration_s: float,
                samples: int = SAMPLES) -> tuple[Verdict, list[Observation]]:
    """Every target observed over the same window (a thread each), and the verdict."""
    found: dict[int, Observation] = {}

    def one(target: int, rank: int | None) -> None:
        found[target] = observe(target, rank, duration_s, samples)

    threads = [threading.Thread(target=one, args=t) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    observations = [found[p] for p, _ in targets]
    return decide_job(observations, duration_s), observations


def attach_command(pid: int, duration_s: float, ranks: bool, run_dir: Path,
                   argv: Sequence[str], no_redact: bool = False,
                   on_start: Callable[[str], None] | None = None) -> Rendered:
    """``nsadiag attach``: check, attach, then write the run directory (see the module
    docstring); returns what the report wrote. Nothing is written when a check fails;
    ``on_start`` hears what is watched once the checks passed."""
    _check_duration(duration_s)
    targets = targets_of(pid, ranks)
    prepare_run_dir(run_dir)
    if on_start:
        on_start(f"sampling {len(targets)} process(es) for {duration_s:g} s")
    write_run_meta(run_dir, "attach", list(argv), pid=pid, duration_s=duration_s,
                   ranks=ranks)
    verdict, observations = observe_all(targets, duration_s)
    write_json(run_dir / "attach.json",
               {"verdict": verdict.to_dict(),
                "state": STATES.get(verdict.name, verdict.name.lower()),
                "processes": [o.to_dict() for o in observations]})
    return render_run(run_dir, no_redact)
