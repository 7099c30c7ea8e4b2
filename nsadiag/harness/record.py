"""The one builder of a watched run's evidence and verdict.

``build_record(spec, run_dir, end, main, ranks, outcome, ...)`` turns what a watch session
saw (nsadiag.harness.session.SessionEnd) into the Evidence of the run's main process (its
heartbeat, result or exception, stall evidence, load, profile, thread exceptions, what a
process killed by a signal left: nsadiag.harness.crash) and, for a job of two or more
ranks, each rank's RankEvidence; decides the verdict (nsadiag.verdict.rules, or across
ranks nsadiag.verdict.ranks); writes evidence.json; and returns the TrialRecord. Trials,
checks, ``nsadiag run`` and ``nsadiag.watch()`` differ only in what they pass: which
stream is the main one, which are ranks, how the run ended, and the facts they add
(``command_facts`` for a user's command or block, the job's shape for a trial).
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nsadiag.evidence import (
    CommandFacts,
    DdpFacts,
    Evidence,
    JobFacts,
    ProcessOutcome,
    StallEvidence,
)
from nsadiag.harness import crash, thread_exceptions
from nsadiag.harness.collectives import summarize
from nsadiag.harness.heartbeat import THIN_BURST_BYTES, THIN_EVERY_S
from nsadiag.harness.session import SessionEnd
from nsadiag.harness.streams import Stream
from nsadiag.hosts.merged import HostsView, decide_hosts
from nsadiag.probes import frames
from nsadiag.probes.exit_calls import exit_calls, last_line, script_of
from nsadiag.probes.frames import describe_place, place_sentence
from nsadiag.probes.gpu import gpu_of
from nsadiag.probes.profile import folded, read_profile
from nsadiag.probes.profile import summarize as summarize_profile
from nsadiag.rundir import TrialRecord, read_tail, write_json, write_text
from nsadiag.sourcelines import capture
from nsadiag.verdict.ranks import STARTED_KEEP, RankEvidence, decide_ranks
from nsadiag.verdict.rules import decide


def outcome_of(returncode: int | None, reason: str | None, wall_s: float, ended_at: float,
               cap: int | None = None, oom_killer: bool = False) -> ProcessOutcome:
    """How a launched tree's first process ended, as the verdict rules read it; ``reason``
    is why nsadiag stopped it ("stall", "budget"; None: it ended by itself); ``oom_killer``
    that the kernel's OOM killer killed it, or, when it exited by itself, one of its
    children (a DataLoader worker) it then reported."""
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
                          memory_cap_bytes=cap, ended_at=ended_at,
                          oom_killer=oom_killer and reason is None)


def how_it_ended(outcome: ProcessOutcome) -> str:
    """"exit code 1", "killed by SIGABRT", "stopped by nsadiag at a stall": how the
    command ended, in words (a signal leaves no exit code)."""
    if outcome.killed_by_runner:
        return {"stall": "stopped by nsadiag at a stall",
                "budget": "stopped by nsadiag at the deadline",
                "interrupted": "stopped by nsadiag when it was interrupted"}.get(
            outcome.kill_reason or "", "stopped by nsadiag")
    if outcome.signal is not None:
        return f"killed by {outcome.signal_name or f'signal {outcome.signal}'}"
    if outcome.exit_code is None:
        return "stopped by nsadiag"
    return f"exit code {outcome.exit_code}"


def memory_holder(path: Path) -> str | None:
    """Where a process's sampled profile saw memory taken step after step and kept (the
    heap's holder, else resident memory's, else CUDA's: its "where"), None when none."""
    summary = summarize_profile(read_profile(path) or {}) if path.is_file() else None
    ledgers = (summary or {}).get("memory") or {}
    for kind in ("heap", "rss", "cuda"):
        holder = (ledgers.get(kind) or {}).get("holder")
        if isinstance(holder, dict) and isinstance(holder.get("where"), str):
            return holder["where"]
    return None


def profile_summary(path: Path) -> dict[str, Any] | None:
    """The summary of a process's sampled profile; its stacks also go to profile.folded
    beside it, for a flame-graph viewer."""
    profile = read_profile(path)
    if not profile:
        return None
    try:
        write_text(path.with_suffix(".folded"), folded(profile), reserve=False)
    except ValueError:
        pass  # the summary still reaches the verdict; the file is a convenience
    return summarize_profile(profile)


def _read_result(stream: Stream) -> dict[str, Any] | None:
    """The result.json a watched process wrote (a trial child always, a user's process when
    an exception ended it)."""
    try:
        return json.loads((stream.path.parent / "result.json").read_text())
    except (OSError, ValueError):
        return None


def stream_result(stream: Stream, ended_ok: bool) -> dict[str, Any] | None:
    """What one process's end says: its result.json, else ok with its steps and
    collectives when the whole run ended well, else nothing."""
    result = _read_result(stream)
    if result is not None:
        return result
    if not ended_ok:
        return None
    return {"status": "ok", "steps_done": stream.counts.get("step", 0),
            "collectives_issued": summarize(stream.collectives)["issued"]}


def _weight(stream: Stream) -> int:
    return sum(n for kind, n in stream.counts.items() if kind != "pulse")


def training_stream(streams: list[Stream]) -> Stream | None:
    """The process of a user's command that trained: the most heartbeat events besides
    pulses."""
    return max(streams, key=_weight, default=None)


def rank_streams(streams: list[Stream]) -> dict[int, Stream]:
    """{rank: stream} of the torchrun ranks among a user's processes (the busiest stream
    when two claim one rank)."""
    ranks: dict[int, Stream] = {}
    for stream in streams:
        if isinstance(stream.rank, int) and (stream.rank not in ranks or
                                             _weight(stream) > _weight(ranks[stream.rank])):
            ranks[stream.rank] = stream
    return ranks


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
                            stream.path.parent / thread_exceptions.FILE_NAME),
                        names=stream.names,
                        memory_holder=memory_holder(stream.path.parent / "profile.json"))


def _place(stall: StallEvidence | None) -> str | None:
    """Where a process was at the stop, in the user's terms (nsadiag.probes.frames
    .place_sentence of its last sample); None without samples."""
    if stall is None or not stall.samples:
        return None
    place = describe_place(stall.samples[-1])
    return place_sentence(place) if place else None


def _launcher(stream: Stream) -> bool:
    """Whether the stream's process is torchrun's launcher, by the command line its
    "start" event recorded (``python -m torch.distributed.run ...`` or ``torchrun ...``)."""
    start = next((e for e in stream.last if e.get("kind") == "start"), {})
    argv = [str(arg) for arg in start.get("orig_argv") or start.get("argv") or []]
    return "torch.distributed.run" in argv or any(
        arg.endswith(("/torchrun", "torch/distributed/run.py")) for arg in argv[:3])


def command_facts(end: SessionEnd, main: Stream | None, outcome: ProcessOutcome,
                  run_dir: Path | None = None) -> CommandFacts:
    """The facts of a user's command or block beyond its Evidence: every process (watched
    ones, and those sampled without a heartbeat) with its role, events and place at the
    stop, which one trained, the exit code and how the run ended; for an exit with a code
    of its own (``run_dir``: where its output was kept), where the script calls that exit
    and the last line it printed."""
    watched = [{"name": s.name, "pid": s.pid, "rank": s.rank, "events": dict(s.counts),
                "role": f"rank {s.rank}" if isinstance(s.rank, int) else
                "the training process" if s is main else
                "the torchrun launcher" if _launcher(s) else "a watched process",
                "place": _place(end.stalls.get(s.name)),
                "stall": end.stalls[s.name].to_dict() if s.name in end.stalls else None}
               for s in end.streams]
    unwatched = [{"name": f"pid-{other['pid']}", "pid": other["pid"], "rank": None,
                  "events": {}, "role": other["role"], "stall": other["stall"],
                  "place": _place(StallEvidence.from_dict(other["stall"]))}
                 for other in end.others]
    calls, last = _own_exit(main, outcome, run_dir)
    return CommandFacts(processes=watched + unwatched,
                        main_process=main.name if main else None,
                        exit_code=outcome.exit_code, ended=how_it_ended(outcome),
                        exit_calls=calls, last_output=last)


def _own_exit(main: Stream | None, outcome: ProcessOutcome, run_dir: Path | None
              ) -> tuple[list[dict[str, Any]] | None, str | None]:
    """(the calls of the training process's script that exit with the command's code, the
    command's last output line) when it exited with a code by itself; (None, None)
    otherwise."""
    code = outcome.exit_code
    if run_dir is None or not code or code < 0 or outcome.killed_by_runner or \
            outcome.signal is not None:
        return None, None
    start = next((e for e in main.last if e.get("kind") == "start"), {}) if main else {}
    argv = [str(a) for a in start.get("argv") or []]
    calls = exit_calls(script_of(argv, Path.cwd()), code)
    last = last_line(read_tail(run_dir / "stdout.txt", 4096),
                     read_tail(run_dir / "stderr.txt", 4096))
    return [call.to_dict() for call in calls], last


def _watched_peers(end: SessionEnd, main: Stream | None) -> list[dict[str, Any]]:
    """The other watched processes sampled at the stall, in the form of Evidence.others, so
    that a wait chain can follow a hop into one of them (a server at the other end of a
    socket, the holder of a file lock); the launcher is left out (it only waits for the
    job)."""
    return [{"pid": s.pid, "role": "a watched process", "stall": end.stalls[s.name].to_dict()}
            for s in end.streams if s is not main and s.name in end.stalls and
            not _launcher(s)]


def heartbeats_lost(streams: Sequence[Stream], run_dir: Path) -> list[str]:
    """A line for each heartbeat file a full disk stopped: its path in the run directory,
    from which event, why and when (its events after that came through its slot)."""
    lines = []
    for stream in streams:
        if stream.lost is None:
            continue
        where = _in_run_dir(stream.path, run_dir)
        when = (time.strftime(" at %H:%M:%S UTC", time.gmtime(stream.lost_t))
                if stream.lost_t else "")
        lines.append(f"{where}: {stream.lost}{when}")
    return lines


def heartbeats_thinned(streams: Sequence[Stream], run_dir: Path) -> list[str]:
    """A line for each heartbeat that spent its budget (nsadiag.harness.heartbeat
    .THIN_BURST_BYTES) and was thinned from then on, with when."""
    lines = []
    for stream in streams:
        if stream.thinned_t is None:
            continue
        when = time.strftime("%H:%M:%S UTC", time.gmtime(stream.thinned_t))
        lines.append(f"{_in_run_dir(stream.path, run_dir)}: from {when} on, past its first "
                     f"{THIN_BURST_BYTES // 2**20} MiB, the heartbeat kept one step event "
                     f"every {THIN_EVERY_S:g} s, each counting the steps since the one "
                     f"before (the step count is whole)")
    return lines


def _in_run_dir(path: Path, run_dir: Path) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return path.name


def build_record(spec: dict[str, Any], run_dir: Path, end: SessionEnd, main: Stream | None,
                 ranks: dict[int, Stream], outcome: ProcessOutcome, *, ended_ok: bool,
                 total_steps: int, fallback: dict[str, Any] | None = None,
                 job: JobFacts | None = None, ddp: DdpFacts | None = None,
                 command: CommandFacts | None = None, hosts: HostsView | None = None,
                 remote: Sequence[RankEvidence] = ()) -> TrialRecord:
    """The record of a watched run (see the module docstring). ``main``: the stream whose
    Evidence is decided; ``ranks``: {rank: stream}, decided across ranks when two or more
    or when the run is a DDP job (``ddp``: one rank's collectives are its evidence too);
    ``ended_ok``: the run ended by itself, successfully (a process without a result then
    reads as ok); ``total_steps``: the steps the run was to take; ``fallback``: the
    exception to take when no process recorded one (the last traceback on a command's
    stderr); ``job``, ``ddp``: a trial's job shape; ``command``: the facts of a user's
    command or block (``command_facts``); ``hosts``: this host's
    view of a job's other hosts, and ``remote`` their ranks (nsadiag.hosts): the verdict
    is then decided over every host's ranks (nsadiag.hosts.merged)."""
    stderr_path = run_dir / "stderr.txt"
    for stream in end.streams:
        stall = end.stalls.get(stream.name)
        if stall is not None:  # every event written before the stop has been read by now
            stall.unfinished_backward = stream.backward.modules()
    result = stream_result(main, ended_ok) if main else None
    if result is None and ended_ok:
        result = {"status": "ok", "steps_done": main.counts.get("step", 0) if main else 0}
    if result is None and fallback is not None:
        result = {"status": "error", "exception": fallback}
    died = outcome.signal is not None and not outcome.killed_by_runner
    evidence = Evidence(
        spec=spec, events=list(main.last) if main else [],
        event_counts=dict(main.counts) if main else {}, result=result, outcome=outcome,
        stall=end.stalls.get(main.name) if main else None,
        expected_events_per_step=(result or {}).get("expected_events_per_step"),
        total_steps=total_steps, stall_timeout_s=spec["stall_timeout_s"],
        pulses=list(main.pulses) if main else [], load=end.load,
        profile=profile_summary(main.path.parent / "profile.json") if main else None,
        thread_exceptions=thread_exceptions.read(
            main.path.parent / thread_exceptions.FILE_NAME) if main else [],
        others=list(end.others) + ([] if len(ranks) >= 2 else _watched_peers(end, main)),
        crash=crash.read(main.path.parent, stderr_path, main.pid) if main and died else None)
    evidence.command = command  # before the verdict: an exit's own call is decided from it
    if hosts is not None and (hosts.lost or hosts.stall or (remote and not ended_ok)):
        rank_list = [rank_evidence(r, s, stream_result(s, ended_ok), end.stalls.get(s.name),
                                   None if outcome.killed_by_runner else stderr_path)
                     for r, s in sorted(ranks.items())]
        own = {r.rank for r in rank_list}
        rank_list += [r for r in remote if r.rank not in own]
        verdict = decide_hosts(evidence, rank_list, hosts)
        evidence.ranks = [r.to_dict() for r in sorted(rank_list, key=lambda r: r.rank)]
    elif len(ranks) >= 2 or (ddp is not None and ranks):
        rank_list = [rank_evidence(r, s, stream_result(s, ended_ok), end.stalls.get(s.name),
                                   None if outcome.killed_by_runner else stderr_path)
                     for r, s in sorted(ranks.items())]
        verdict = decide_ranks(evidence, rank_list)
        evidence.ranks = [r.to_dict() for r in rank_list]
    else:
        verdict = decide(evidence)
    evidence.job, evidence.ddp, evidence.command = job, ddp, command
    evidence.heartbeats_lost = heartbeats_lost(end.streams, run_dir) or None
    evidence.heartbeats_thinned = heartbeats_thinned(end.streams, run_dir) or None
    if hosts is not None:
        evidence.hosts = hosts.to_dict()
    # the code of the lines the evidence and the verdict's facts name, from this machine
    evidence.source = capture([evidence.to_dict(), verdict.to_dict()], run_dir)
    with contextlib.suppress(ValueError):  # a copy only: the record keeps the evidence
        write_json(run_dir / "evidence.json", evidence.to_dict(), reserve=False)
    # absolute: a relative --out (runs/...) would name a directory relative to whoever
    # renders the record, and its files (the flame graph's profile) would go unread
    return TrialRecord(spec=spec, evidence=evidence, verdict=verdict,
                       trial_dir=str(run_dir.resolve()), wall_s=outcome.wall_s,
                       gpu=gpu_of(end.gpu))
