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

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from nsadiag.envinfo import ptrace_permission
from nsadiag.evidence import StackSample
from nsadiag.probes import frames, stacks
from nsadiag.processes import can_attach, rank_processes


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


def check_can_attach(pid: int) -> None:
    """ValueError (one line) when the process is missing, or ptrace will be refused and the
    faulthandler fallback is not possible either (see probes.stacks)."""
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
                   timeout_s: float = 10.0) -> dict[str, Any]:
    """Sample one process, or every rank under a launcher; returns a JSON-able summary."""
    if count < 1:
        raise ValueError(f"samples: must be >= 1, got {count}")
    if interval_s < 0:
        raise ValueError(f"interval: must be >= 0 seconds, got {interval_s:g}")
    targets = rank_processes(pid) if ranks else [(pid, None)]
    for target, _ in targets:
        check_can_attach(target)
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


def stacks_markdown(summary: dict[str, Any], frames: int = 14) -> str:
    """A Markdown report of a stacks summary: one row per process, the odd ones out, and
    each process's last sample, innermost frame first."""
    states = sorted({p["state"] for p in summary["processes"]})
    md = [f"# nsadiag stacks: {', '.join(states)}", "",
          "| pid | rank | state | CPU | samples | innermost frames |", "|---|---|---|---|---|---|"]
    for proc in summary["processes"]:
        cpu = "-" if proc["cpu_fraction"] is None else f"{100 * proc['cpu_fraction']:.0f}%"
        rank = "-" if proc["rank"] is None else str(proc["rank"])
        md.append(f"| {proc['pid']} | {rank} | **{proc['state']}** | {cpu} | "
                  f"{len(proc['samples'])} | {proc['signature'] or '-'} |")
    if summary["odd_ones_out"]:
        md += [""] + [f"Odd one out: pid {pid} differs from the other processes."
                      for pid in summary["odd_ones_out"]]
    for proc in summary["processes"]:
        md += ["", f"## pid {proc['pid']}: {proc['state']}", "", f"`{proc['cmdline']}`", ""]
        md += [f"- unavailable: {reason}" for reason in proc["unavailable"]]
        if not proc["samples"]:
            continue
        last = proc["samples"][-1]
        if last.get("note"):
            md.append(f"- note: {last['note']}")
        md += ["", "```"]
        for thread in last["threads"]:
            idle = "" if thread.get("active", True) else " (idle)"
            md.append(f"thread {thread.get('name') or hex(thread['thread_id'])}{idle}:")
            for frame in thread["frames"][:frames]:
                where = f"{Path(frame['file'] or '?').name}:{frame['line']}"
                native = " [native]" if frame.get("is_native") else ""
                code = f"  # {frame['code']}" if frame.get("code") else ""
                md.append(f"  {frame['function']} ({where}){native}{code}")
        md.append("```")
    return "\n".join(md) + "\n"


def write_stacks_report(summary: dict[str, Any], out_dir: Path) -> Path:
    """stacks.json and stacks.md (host names, IPs and user names redacted) in out_dir."""
    from nsadiag.report import redact

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "stacks.json").write_text(redact(json.dumps(summary, indent=1)))
    path = out_dir / "stacks.md"
    path.write_text(redact(stacks_markdown(summary)))
    return path
