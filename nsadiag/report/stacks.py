"""The report of `nsadiag stacks`: what a live process (or every rank) was doing.

From the run directory's stacks.json (nsadiag.commands.stacks: every sample of every
process): one row per process (state, CPU, innermost frames), the odd ones out, and per
process the threads that matter in its last sample (nsadiag.probes.frames
.threads_that_matter: the main thread, running threads, threads in the user's own code,
such as one blocked on a lock), then every other thread of that sample.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from nsadiag.evidence import ThreadStack
from nsadiag.findingdata import Finding
from nsadiag.probes.frames import threads_that_matter, wait_frame
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary
from nsadiag.report.top import items
from nsadiag.runmeta import RunMeta
from nsadiag.stacksrecord import SampledProcess, StacksRecord

FRAMES = 14
SUMMARY_FRAMES = 8


def thread_view(thread: ThreadStack, frames: int = SUMMARY_FRAMES) -> dict[str, Any]:
    """A thread as summary.json and the terminal show it: name, running or idle, the
    lock or condition it waits in, its innermost frames."""
    waiting = wait_frame(thread)
    return {"name": thread.name or hex(thread.thread_id), "active": thread.active,
            "waiting_in": waiting.where() if waiting else None,
            "frames": _frame_lines(thread)[:frames]}


def _frame_lines(thread: ThreadStack) -> list[str]:
    """The thread's frames innermost first, each run of native frames one line naming its
    libraries, Python frames with their code."""
    lines: list[str] = []
    native: list[str] = []
    for frame in [*thread.frames, None]:
        if frame is not None and frame.is_native:
            native.append(PurePath(frame.file or "?").name)
            continue
        if native:
            noun = "native frame" if len(native) == 1 else "native frames"
            lines.append(f"[{len(native)} {noun} in {', '.join(dict.fromkeys(native))}]")
            native = []
        if frame is not None:
            lines.append(frame.where() + (f"  # {frame.code}" if frame.code else ""))
    return lines


def process_view(proc: SampledProcess) -> dict[str, Any]:
    """A process of stacks.json as summary.json keeps it: everything but the samples,
    the threads that matter in the last sample, and how many other threads there were."""
    view: dict[str, Any] = {
        "pid": proc.pid, "rank": proc.rank, "cmdline": proc.cmdline, "state": proc.state,
        "cpu_fraction": proc.cpu_fraction, "signature": proc.signature,
        "unavailable": list(proc.unavailable)}
    last = proc.samples[-1] if proc.samples else None
    shown = threads_that_matter(last) if last else []
    view["threads"] = [thread_view(t) for t in shown]
    view["other_threads"] = len(last.threads) - len(shown) if last else 0
    view["samples"] = len(proc.samples)
    return view


def build_stacks_report(stacks: StacksRecord, meta: RunMeta, finding: Finding
                        ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a stacks run and its ``finding`` (the one stacks.json
    keeps, decided by nsadiag.commands.stacks)."""
    processes = [process_view(p) for p in stacks.processes]
    md = items(finding.results)
    md += ["", "| pid | rank | state | CPU | samples | innermost frames |",
           "|---|---|---|---|---|---|"]
    for proc in processes:
        cpu = "-" if proc["cpu_fraction"] is None else f"{100 * proc['cpu_fraction']:.0f}%"
        rank = "-" if proc["rank"] is None else str(proc["rank"])
        md.append(f"| {proc['pid']} | {rank} | **{proc['state']}** | {cpu} | "
                  f"{proc['samples']} | {proc['signature'] or '-'} |")
    if stacks.odd_ones_out:
        md += [""] + [f"Odd one out: pid {pid} differs from the other processes."
                      for pid in stacks.odd_ones_out]
    report = Report.of(finding, results=md)
    for raw, proc in zip(stacks.processes, processes, strict=True):
        md = report.add(f"pid {proc['pid']}: {proc['state']}", [f"`{proc['cmdline']}`", ""]).body
        md += [f"- unavailable: {reason}" for reason in proc["unavailable"]]
        if not raw.samples:
            continue
        last = raw.samples[-1]
        if last.note:
            md.append(f"- note: {last.note}")
        shown = {t["name"] for t in proc["threads"]}
        md += ["", f"Threads that matter ({len(proc['threads'])}; "
                   f"{proc['other_threads']} other):", ""]
        for thread in proc["threads"]:
            md += _thread_lines(thread)
        others = [t for t in last.threads if (t.name or hex(t.thread_id)) not in shown]
        if others:
            md += ["", "Other threads:", ""]
            for thread in others:
                md += _thread_lines(thread_view(thread, FRAMES))
    report.add("Reproduction", ["```", shlex.join(meta.argv), "```"])
    summary = Summary(command="stacks", headline=finding.headline, status="measured",
                      details={"finding": finding.to_dict(), "processes": processes,
                               "odd_ones_out": list(stacks.odd_ones_out),
                               "clusters": list(stacks.clusters)})
    return report.markdown(), summary.to_dict()


def _thread_lines(thread: Mapping[str, Any]) -> list[str]:
    state = "running" if thread["active"] else "idle"
    waiting = f", waiting in {thread['waiting_in']}" if thread["waiting_in"] else ""
    return ["```", f"thread {thread['name']} ({state}{waiting}):",
            *(f"  {frame}" for frame in thread["frames"]), "```"]

