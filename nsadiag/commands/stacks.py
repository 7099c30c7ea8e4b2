"""nsadiag stacks: what a live process (or every rank of a torchrun job) is doing.

For each process: several py-spy samples spaced `interval_s` apart (the Python-only dump
first; with `native`, a native dump under a hard deadline — py-spy resumes the target
itself, and a dump that times out is abandoned, never left attached), the CPU time the
process used meanwhile, and a classification from `probes.frames.classify`: waiting,
busy-python, busy-native or in-collective. With `ranks`, the processes are the Python
children of a torchrun (or any launcher) PID; identical innermost stacks are clustered and
a rank alone in its cluster is named the odd one out.

Before anything, ptrace permission is checked; a refusal is one clear line, unless the
process is an nsadiag trial child with faulthandler armed: then its samples come from
faulthandler dumps (the capture ladder's last rung, see probes.stacks).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from nsadiag.envinfo import ptrace_permission
from nsadiag.evidence import StackSample
from nsadiag.finding.measured import stacks_finding
from nsadiag.probes import frames, stacks
from nsadiag.processes import can_attach, check_python, is_python, rank_processes
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.report.stacks import process_view
from nsadiag.rundir import prepare_run_dir, write_json, write_run_meta
from nsadiag.stacksrecord import StacksRecord


@dataclass
class ProcessReport:
    pid: int
    rank: int | None
    cmdline: str
    samples: list[StackSample] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    cpu_fraction: float | None = None
    state: str = "unknown"
    signature: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "rank": self.rank, "cmdline": self.cmdline,
                "state": self.state, "cpu_fraction": self.cpu_fraction,
                "signature": self.signature, "unavailable": self.unavailable,
                "samples": [s.to_dict() for s in self.samples]}


MAX_CHILDREN = 16
"""Python processes under PID sampled with it (DataLoader workers, a pool, a launcher's
script): the first of them, by pid."""


def with_python_children(pid: int) -> list[tuple[int, int | None]]:
    """(pid, None) of PID and of the Python processes under it (MAX_CHILDREN at most): a
    launcher or a wrapper shell is sampled with what it started. PID itself is left out
    when it is not Python but something under it is (``bash -c 'python train.py'``)."""
    try:
        children = sorted(c.pid for c in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        children = []
    python = [child for child in children if is_python(child)][:MAX_CHILDREN]
    own = [(pid, None)] if is_python(pid) or not python else []
    return own + [(child, None) for child in python]


def check_can_attach(pid: int) -> None:
    """ValueError (one line) when the process is missing, or ptrace will be refused and the
    faulthandler fallback is not possible either (see probes.stacks), or it is not a Python
    process (a kernel thread, a shell)."""
    check_python(pid, "stacks samples Python programs (give the PID of the python process)")
    can_attach(pid, ptrace_permission())


def sample_process(pid: int, rank: int | None, count: int, interval_s: float,
                   native: bool, timeout_s: float) -> ProcessReport:
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
    except psutil.NoSuchProcess:
        return ProcessReport(pid, rank, "", unavailable=["process is gone"], state="gone")
    report = ProcessReport(pid, rank, cmdline)
    for i in range(count):
        if i:
            time.sleep(interval_s)
        taken = stacks.capture(pid, native=native, timeout_s=timeout_s)
        if isinstance(taken, str):
            report.unavailable.append(taken)
        else:
            report.samples.append(taken)
    report.unavailable = sorted(set(report.unavailable))
    if report.samples:
        report.cpu_fraction = frames.cpu_fraction(report.samples)
        report.state = frames.classify(report.samples)
        report.signature = frames.stack_signature(report.samples[-1])
    return report


def odd_ones_out(reports: list[ProcessReport]) -> list[ProcessReport]:
    """Processes whose stack signature no other process shares, when the others agree."""
    return frames.odd_ones_out(
        reports, lambda r: (r.signature or "(no Python frame)") if r.samples else "")


def stacks_command(pid: int, ranks: bool, count: int, interval_s: float, native: bool,
                   timeout_s: float = 10.0, on_start: Callable[[str], None] | None = None
                   ) -> dict[str, Any]:
    """Sample one process, or every rank under a launcher; returns a JSON-able summary.
    ``on_start`` hears what is sampled once the targets are known to be sampleable."""
    if count < 1:
        raise ValueError(f"samples: must be >= 1, got {count}")
    if not interval_s >= 0:
        raise ValueError(f"interval: must be >= 0 seconds, got {interval_s:g}")
    targets = rank_processes(pid) if ranks else with_python_children(pid)
    for target, _ in targets:
        check_can_attach(target)
    if on_start:
        on_start(f"{count} sample(s) of {len(targets)} process(es), {interval_s:g} s apart")
    reports = [sample_process(p, r, count, interval_s, native, timeout_s) for p, r in targets]
    odd = odd_ones_out(reports) if ranks else []
    return {"processes": [r.to_dict() for r in reports],
            "clusters": _clusters(reports), "odd_ones_out": [r.pid for r in odd]}


def _clusters(reports: list[ProcessReport]) -> list[dict[str, Any]]:
    groups: dict[str, list[int]] = defaultdict(list)
    for report in reports:
        groups[report.signature or "no sample"].append(report.rank if report.rank is not None
                                                        else report.pid)
    return [{"signature": sig, "members": members} for sig, members in groups.items()]


def stacks_run(pid: int, ranks: bool, count: int, interval_s: float, native: bool,
               run_dir: Path, argv: Sequence[str], no_redact: bool = False,
               on_start: Callable[[str], None] | None = None) -> Rendered:
    """`nsadiag stacks`: sample (see ``stacks_command``; a missing process or a refused
    ptrace is refused before the run directory exists), keep the samples in stacks.json
    (raw) with the finding decided from them once (nsadiag.finding.measured), render
    report.md and summary.json (nsadiag.report.stacks). ``on_start`` hears
    when sampling starts."""
    summary = stacks_command(pid, ranks, count, interval_s, native, on_start=on_start)
    sampled = StacksRecord.from_dict(summary)
    summary["finding"] = stacks_finding([process_view(p) for p in sampled.processes],
                                        list(sampled.odd_ones_out)).to_dict()
    prepare_run_dir(run_dir)
    write_run_meta(run_dir, "stacks", list(argv), pid=pid, ranks=ranks)
    write_json(run_dir / "stacks.json", summary)
    return render_run(run_dir, no_redact)
