"""The evidence of a stalled or slow job, taken from every process at the same time.

``capture_all(pids, dirs, due, window_s, others, ends_by)`` samples every watched process
over the capture window (nsadiag.harness.times) in a thread each, when the stall clock
says stop:

stall   several py-spy samples spaced over the window (faulthandler dumps when py-spy is
        missing or refused), the CPU time and the main thread's on-CPU and run-queue time
        over the same window, a faulthandler dump, what the OS says it and its children
        wait on (nsadiag.probes.waits); and each process of the job that writes
        no heartbeat (a DataLoader worker, a launcher: nsadiag.harness.tree) sampled
        without pausing it;
budget  two stack samples of every process (a slow run's hot frame), the processes that
        write no heartbeat included (what a slow run's DataLoader workers were doing).

A stall's capture ends by one deadline, the end of the capture window: each process's
samples are spread over the window and cut off at its end, and a process whose capture
is still running CAPTURE_FINISH_S later is left behind (its evidence says what was not
taken). Only a process's first sample may run past the window, by its own time limit: a
verdict without a single stack is worse than a late one.

``capture_stall`` and ``sample_stacks`` are the pieces, also used by ``nsadiag attach``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from nsadiag.evidence import StallEvidence
from nsadiag.harness import child_exits
from nsadiag.harness.launch import Launched
from nsadiag.harness.machine import main_thread_clock
from nsadiag.harness.streams import Due
from nsadiag.harness.times import CAPTURE_FINISH_S, SAMPLE_TIMEOUT_S
from nsadiag.harness.tree import python_processes, roles
from nsadiag.probes import frames, stacks
from nsadiag.probes.scopes import thread_scopes
from nsadiag.probes.waits import read_waits

STACK_SAMPLES = 3
DEADLINE_SLACK_S = 0.05
"""A sample due this little after its deadline is still taken (clock readings differ)."""
MIN_SAMPLE_S = 0.25
"""A sample is not started with less than this left before its ``ends_by``: a py-spy dump
of a small process takes about this long on a quiet machine."""


def sample_stacks(pid: int, count: int, interval_s: float, *, timeout_s: float | None = None,
                  faulthandler_file: Path | None = None, native: bool = True,
                  local_names: bool = False, deadline: float | None = None,
                  ends_by: float | None = None) -> tuple[list[Any], list[str]]:
    """`count` samples `interval_s` apart (py-spy, with native frames when `native` and it
    can, else the faulthandler dump into `faulthandler_file`), and the reasons for any
    sample that could not be taken. `timeout_s` bounds each sample (default: max(5 s, 4
    intervals)). Without `native` py-spy does not pause the process; `local_names` reads
    the locals that say what a process is (nsadiag.probes.stacks.KEEP_LOCALS). With
    `deadline` (a time.monotonic() reading) the samples are taken at fixed times spread
    from now to it, a late sample is not followed by the full interval, and none starts
    after it: the whole takes about as long as asked, however slow each sample is. With
    `ends_by` instead, every sample ends by it (see _samples_ending_by). A thread named in
    one sample is named in all (a late sample may come from faulthandler, which names none:
    stacks.carry_thread_names)."""
    limit = timeout_s if timeout_s is not None else max(5.0, interval_s * 4)
    if ends_by is not None:
        samples, unavailable = _samples_ending_by(pid, count, ends_by, limit,
                                                  faulthandler_file, native, local_names)
        stacks.carry_thread_names(samples)
        return samples, unavailable
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
        given = limit if deadline is None else \
            max(0.5, min(limit, deadline - time.monotonic()))
        taken = stacks.capture(pid, native=native, timeout_s=given,
                               faulthandler_file=faulthandler_file, local_names=local_names)
        if isinstance(taken, str):
            unavailable.append(taken)
        else:
            samples.append(taken)
    stacks.carry_thread_names(samples)
    return samples, sorted(set(unavailable))


def _samples_ending_by(pid: int, count: int, ends_by: float, limit: float,
                       faulthandler_file: Path | None, native: bool, local_names: bool
                       ) -> tuple[list[Any], list[str]]:
    """`count` samples started at equal steps from now to `ends_by` (a time.monotonic()
    reading), each given until `ends_by` at most (py-spy is killed there) except the first,
    which gets its whole `limit`; a sample with less than MIN_SAMPLE_S left is not started.
    A sample cut off at `ends_by`, and those never started, are named in the reasons."""
    samples, unavailable = [], []
    start = time.monotonic()
    step = max(0.0, ends_by - start) / max(count, 1)
    for i in range(count):
        time.sleep(max(0.0, start + i * step - time.monotonic()))
        left = ends_by - time.monotonic()
        if i and left < MIN_SAMPLE_S:
            which = f"{i + 1} of {count}" if i + 1 == count else f"{i + 1}-{count} of {count}"
            unavailable.append(f"stack sample {which}: not taken, the capture window had "
                               f"ended")
            break
        cut = bool(i) and left < limit
        taken = stacks.capture(pid, native=native, timeout_s=min(limit, left) if cut else limit,
                               faulthandler_file=faulthandler_file, local_names=local_names)
        if isinstance(taken, str):
            # py-spy's own timeout message says how long it was given; this says why
            ended = cut and "timed out" in taken
            unavailable.append(f"{taken} (cut off at the end of the capture window)"
                               if ended else taken)
        else:
            samples.append(taken)
    return samples, sorted(set(unavailable))


def capture_stall(pid: int, since_last_event_s: float, window_s: float,
                  faulthandler_path: Path | None, timeout_s: float | None = None,
                  count: int = STACK_SAMPLES, native: bool = True, dump: bool = True,
                  local_names: bool = False, deadline: float | None = None,
                  ends_by: float | None = None) -> StallEvidence:
    """`count` stack samples spread over `window_s`, the CPU time the process used
    meanwhile (and its main thread's on-CPU and run-queue time), and with `dump` a
    faulthandler dump of all threads into `faulthandler_path` (SIGUSR1, sent only when the
    process has its handler installed; None: the file the process holds open, see
    probes.stacks). A process forked from a watched one inherits its handler and its open
    dump file: it must be sampled without `dump`, or its dump would land in the parent's
    file. `deadline` or `ends_by` bounds the samples (see sample_stacks)."""
    cpu_before, clock_before = stacks.process_cpu_seconds(pid), main_thread_clock(pid)
    started = time.monotonic()
    # against a deadline the last sample falls at the window's end
    interval = window_s / (max(count - 1, 1) if deadline is not None else count)
    samples, unavailable = sample_stacks(pid, count, interval,
                                         timeout_s=timeout_s,
                                         faulthandler_file=faulthandler_path, native=native,
                                         local_names=local_names, deadline=deadline,
                                         ends_by=ends_by)
    elapsed = time.monotonic() - started
    cpu_after, clock_after = stacks.process_cpu_seconds(pid), main_thread_clock(pid)
    cpu_delta = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    main_cpu = runq = None
    if clock_before and clock_after:
        main_cpu, runq = clock_after[0] - clock_before[0], clock_after[1] - clock_before[1]
    if dump and not any(stacks.from_faulthandler(s) for s in samples):
        dumped = stacks.faulthandler_capture(pid, faulthandler_path)  # only if registered
        if isinstance(dumped, str):
            unavailable.append(dumped)
    return StallEvidence(since_last_event_s=since_last_event_s, window_s=elapsed,
                         cpu_delta_s=cpu_delta, samples=samples, unavailable=unavailable,
                         stacks_class=frames.classify(samples) if samples else None,
                         main_cpu_delta_s=main_cpu, runq_delta_s=runq)


OTHER = "other-"
"""capture_all's key prefix for a process that writes no heartbeat: other-<pid>."""


def capture_all(pids: dict[str, int], dirs: dict[str, Path], due: Due, window_s: float,
                others: Sequence[psutil.Process] = (), ends_by: float | None = None
                ) -> dict[str, StallEvidence]:
    """Evidence of every process at the same time (one thread each, over ``window_s`` at a
    stall): the watched ones by name, and each of ``others`` (the job's processes that
    write no heartbeat, nsadiag.harness.tree) under ``other-<pid>``, sampled without
    pausing it, with the locals that say what it is and no faulthandler dump. A stall's
    capture ends by ``ends_by`` (a time.monotonic() reading; None: ``window_s`` from now),
    see the module docstring."""
    started = time.monotonic()
    ends = ends_by if ends_by is not None else started + window_s
    # each thread puts its evidence here whole, once with its samples and again with its
    # waits, so that a capture left behind at the deadline never changes what was returned
    found: dict[str, StallEvidence] = {}

    def stall(name: str, pid: int) -> None:
        if name.startswith(OTHER):
            sampled = capture_stall(pid, due.quiet_s, window_s, None,
                                    timeout_s=SAMPLE_TIMEOUT_S, native=False, dump=False,
                                    local_names=True, ends_by=ends)
        else:
            sampled = capture_stall(pid, due.quiet_s, window_s,
                                    dirs[name] / "faulthandler.txt",
                                    timeout_s=SAMPLE_TIMEOUT_S, ends_by=ends)
        sampled.opportunity_s, sampled.stretched = due.opportunity_s, due.stretched
        found[name] = sampled
        # what the kernel says it (and its children) wait on, and the locks its code holds,
        # for the wait chain; a process nsadiag does not watch with its own children (a
        # compile worker's C++ compiler)
        samples = sampled.samples
        waits = read_waits(pid, depth=1 if name.startswith(OTHER) else 2,
                           scopes=thread_scopes(samples[-1]) if samples else ())
        if not name.startswith(OTHER):  # its children that ended, as it reaped them too
            reaped = child_exits.read(dirs[name] / child_exits.FILE_NAME)
            waits = dataclasses.replace(waits, ended=(*reaped, *(
                z for z in waits.ended if z.pid not in {e.pid for e in reaped})))
        found[name] = dataclasses.replace(sampled, waits=waits)

    def budget(name: str, pid: int) -> None:
        other = name.startswith(OTHER)
        samples, unavailable = sample_stacks(
            pid, 2, 0.5, timeout_s=SAMPLE_TIMEOUT_S, native=not other, local_names=other,
            faulthandler_file=None if other else dirs[name] / "faulthandler.txt")
        found[name] = StallEvidence(since_last_event_s=due.quiet_s, window_s=1.0,
                                    cpu_delta_s=None, samples=samples, unavailable=unavailable,
                                    stacks_class=frames.classify(samples) if samples else None,
                                    opportunity_s=due.opportunity_s)

    target = stall if due.reason == "stall" else budget
    jobs = dict(pids)
    jobs.update({f"{OTHER}{process.pid}": process.pid for process in others})
    # daemon threads: one left behind at the deadline must not keep nsadiag from exiting
    threads = {name: threading.Thread(target=target, args=(name, pid), daemon=True)
               for name, pid in jobs.items()}
    for thread in threads.values():
        thread.start()
    if due.reason != "stall":
        for thread in threads.values():
            thread.join()
        return dict(found)
    # the first sample may take its whole time limit (see the module docstring)
    cut_at = max(ends, started + SAMPLE_TIMEOUT_S) + CAPTURE_FINISH_S
    for thread in threads.values():
        thread.join(max(0.0, cut_at - time.monotonic()))
    return {name: found[name] if not thread.is_alive() else
            _left_behind(found.get(name), due, time.monotonic() - started)
            for name, thread in threads.items()}


def _left_behind(sampled: StallEvidence | None, due: Due, elapsed_s: float
                 ) -> StallEvidence:
    """The evidence of a process whose capture was still running at the deadline: its
    samples when they were all taken (what it waits on was not read), else none."""
    why = f"capture cut off: still running {elapsed_s:.1f} s after it began"
    if sampled is not None:
        return dataclasses.replace(sampled, unavailable=[
            *sampled.unavailable, f"{why}, before what the process waits on was read"])
    return StallEvidence(since_last_event_s=due.quiet_s, window_s=elapsed_s, cpu_delta_s=None,
                         unavailable=[f"{why}, before its stack samples were all taken"],
                         opportunity_s=due.opportunity_s, stretched=due.stretched)


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
