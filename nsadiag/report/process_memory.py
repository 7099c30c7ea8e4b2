"""The Process memory section of a run's report: each process's private and shared memory
over the run (nsadiag.record.process_memory), as a table and a plot.

One row per process, largest private peak first (``ROWS`` at most; the rest counted):
what it is (the training process, a DataLoader worker with the process that forked it, a
forked child, or its command), its private memory at the first reading, at its peak and
at the last, its shared memory at the first and the last reading, its peak swap, how many
readings and over how long. The plot (process-memory.png) draws each process's private
memory as a solid line and its shared memory as a dashed one in the same colour, so a
worker that copies its parent shows as the two lines crossing.
"""

from __future__ import annotations

from pathlib import Path

from nsadiag.finding.numbers import sig, size
from nsadiag.record.process_memory import WATCHED_INTERVAL_S, ProcessMemory, ProcessSeries
from nsadiag.report.plots import process_memory_plot

ROWS = 12
PLOTTED = 8
PLOT_NAME = "process-memory.png"
MIN_PLOTTED_BYTES = 8 * 2**20  # a process that never held this much is not drawn


def role(series: ProcessSeries, main_pid: int | None) -> str:
    if series.pid == main_pid:
        return "the training process"
    if series.dataset is not None:
        return f"DataLoader worker (forked by {series.forked_by})"
    if series.forked_by is not None:
        return f"forked child of {series.forked_by}"
    command = series.command or "?"
    return command if len(command) <= 40 else command[:37] + "..."


def _ranked(memory: ProcessMemory) -> list[ProcessSeries]:
    return sorted((s for s in memory.series if s.points), key=lambda s: -s.peak("private"))


def process_memory_section(memory: ProcessMemory | None, main_pid: int | None,
                           run_dir: Path) -> list[str]:
    """The section's lines ([] when the record has no readings); writes the plot into
    ``run_dir`` when two readings or more of some process were taken."""
    if memory is None:
        return []
    if memory.unavailable:
        return [f"Each process's memory was not read: {memory.unavailable}."]
    ranked = _ranked(memory)
    if not ranked:
        return []
    lines = [f"Each process's memory from /proc/PID/smaps_rollup: a new worker read every "
             f"half second at first, then every {sig(memory.interval_s)} s (one whose private "
             f"memory grows, as often as half a second); a process with "
             f"a heartbeat every {sig(WATCHED_INTERVAL_S)} s (private: pages only it holds and has "
             f"written; shared: written pages it still shares, as a forked worker shares "
             f"its parent's).", "",
             "| pid | what it is | private first / peak / last | shared first / last | "
             "swap peak | readings |", "|---|---|---|---|---|---|"]
    for s in ranked[:ROWS]:
        first, last = s.points[0], s.points[-1]
        span = f" over {sig(last.t - first.t)} s" if len(s.points) > 1 else ""
        ended = ", ended" if s.ended else ""
        lines.append(f"| {s.pid} | {role(s, main_pid)} | {size(first.private)} / "
                     f"{size(s.peak('private'))} / {size(last.private)} | "
                     f"{size(first.shared)} / {size(last.shared)} | {size(s.peak('swap'))} "
                     f"| {len(s.points)}{span}{ended} |")
    hidden = len(ranked) - ROWS + memory.left_out
    if hidden > 0:
        lines += ["", f"{hidden} more processes are not shown (the smallest, or ended ones "
                      f"whose memory changed least)."]
    for s in ranked:
        if s.dataset is not None and s.dataset.containers:
            held = ", ".join(f"`{c.path}` ({c.type} of {c.length:,} {c.item_type}, about "
                             f"{size(c.estimated_bytes)})" for c in s.dataset.containers)
            lines += ["", f"The dataset the DataLoader forked its workers with, "
                          f"`{s.dataset.class_name}`, held: {held}."]
            break
    drawn = [s for s in ranked if len(s.points) > 1 and
             max(s.peak("private"), s.peak("shared")) >= MIN_PLOTTED_BYTES][:PLOTTED]
    png = process_memory_plot([(f"{s.pid} {role(s, main_pid)}", s) for s in drawn],
                              run_dir / PLOT_NAME)
    if png is not None:
        lines += ["", f"![private (solid) and shared (dashed) memory of each process]"
                      f"({png.name})"]
    return lines
