"""What the command line prints: results on stdout, progress and errors on stderr.

Both streams go through the run's redaction (nsadiag.redact) unless the command was
given --no-redact, so a secret in an exception message, a host name or an address never
reaches the terminal; the hosts a job's ranks are named by are shown once its report
names them. A closed stream (``| head -n 1``) is ``OutputClosed``, one line on
stderr and a non-zero exit, not a traceback. Progress: a live bar or spinner on a terminal,
one plain line per step elsewhere (CI logs, pipes). Rich is imported when something is
printed, not before. What is printed is stripped of control characters first
(nsadiag.textsafe): a record's text cannot move the cursor, set the title or the clipboard.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsadiag.fmt import mib as mib_of
from nsadiag.textsafe import clean, clean_line

if TYPE_CHECKING:
    from rich.console import Console

    from nsadiag.report.dispatch import Rendered
    from nsadiag.rundir import TrialRecord
    from nsadiag.spec import TrialSpec


class OutputClosed(Exception):
    """stdout or stderr was closed before nsadiag finished writing to it."""


class _Stream(io.TextIOBase):
    """A text stream that redacts what it is given and writes it through at once.

    It writes to the process's stdout or stderr as they are at the time of the write (a
    test's runner swaps them), but never to a live display's stand-in: while rich shows a
    spinner or a bar on a terminal it replaces sys.stdout and sys.stderr with proxies that
    print through the display's console, which is this stream, so a write there would come
    back here without end."""

    def __init__(self, terminal: Terminal, err: bool):
        self.terminal, self.err = terminal, err

    @property
    def target(self) -> Any:
        stream = sys.stderr if self.err else sys.stdout
        while hasattr(stream, "rich_proxied_file"):  # rich.file_proxy.FileProxy
            stream = stream.rich_proxied_file
        return stream

    def write(self, text: str) -> int:
        shown = self.terminal.redacted(text)
        try:
            self.target.write(shown)
            self.target.flush()
        except (BrokenPipeError, ValueError) as err:  # ValueError: the stream is closed
            raise OutputClosed("stderr" if self.err else "stdout") from err
        return len(text)

    def flush(self) -> None:
        try:
            self.target.flush()
        except (BrokenPipeError, ValueError) as err:
            raise OutputClosed("stderr" if self.err else "stdout") from err

    def isatty(self) -> bool:
        return bool(getattr(self.target, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", "utf-8") or "utf-8"


class Terminal:
    """The two output streams of one command, redacted unless ``redact`` is False."""

    def __init__(self) -> None:
        self.redact = True
        self._redactor: Any = None
        self._shown: list[str] = []
        self._out: Console | None = None
        self._err: Console | None = None

    def redacted(self, text: str) -> str:
        if not self.redact:
            return text
        if self._redactor is None:
            from nsadiag.redact import Redactor

            self._redactor = Redactor(shown_hosts={h: h for h in self._shown})
        return self._redactor.text(text)

    def show_hosts(self, hosts: Sequence[str]) -> None:
        """Show ``hosts`` (the job's hosts its ranks are named by) as they are from now on,
        as the run's report does (nsadiag.redact)."""
        self._shown = list(hosts)
        self._redactor = None

    @property
    def out(self) -> Console:
        if self._out is None:
            from rich.console import Console

            self._out = Console(file=_Stream(self, err=False), highlight=False)
        return self._out

    @property
    def err(self) -> Console:
        if self._err is None:
            from rich.console import Console

            self._err = Console(file=_Stream(self, err=True), highlight=False)
        return self._err

    @property
    def live(self) -> bool:
        """Whether stderr is a terminal (live bars and spinners) rather than a log."""
        return self.err.is_terminal

    def print(self, text: str = "", style: str | None = None) -> None:
        """One line of results on stdout."""
        self.out.print(clean(text), style=style, markup=False, soft_wrap=True)

    def note(self, text: str) -> None:
        """One plain line of progress on stderr."""
        self.err.print(clean(text), markup=False, soft_wrap=True, highlight=False)

    def error(self, message: str) -> None:
        """``nsadiag: error: <message>`` as one line on stderr."""
        line = " ".join(clean(message).split())
        self.err.print(f"nsadiag: error: {line}", markup=False, soft_wrap=True)

    def json(self, data: Any) -> None:
        """JSON on stdout (nothing else there)."""
        self.out.print(json.dumps(data, indent=1), markup=False, soft_wrap=True,
                       highlight=False)

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[Any]:
        """A spinner with the elapsed time on a terminal; elsewhere plain lines. Yields a
        function the library's progress callbacks call as work starts and moves on: the
        first call prints ``text`` too, so a command refused before any work prints only
        its error."""
        if self.live:
            started = time.monotonic()
            with self.err.status(text) as spinner:
                def update(new: str) -> None:
                    spinner.update(f"{text}: {new} ({time.monotonic() - started:.0f} s)")
                yield update
            return
        shown = []

        def update(new: str) -> None:
            if not shown:
                shown.append(text)
                self.note(f"{text} ...")
            self.note(f"  {new}")
        yield update

    def table(self, columns: Sequence[str], rows: Sequence[Sequence[Any]],
              styles: Sequence[str | None] | None = None, plain: bool = False) -> None:
        """A table on stdout (``plain``: no header, no box); cells are plain text (never
        markup)."""
        from rich.table import Table
        from rich.text import Text

        table = Table(*columns, show_header=not plain, box=None) if plain else Table(*columns)
        for i, row in enumerate(rows):
            table.add_row(*(Text("-" if v is None else clean_line(str(v))) for v in row),
                          style=(styles[i] if styles else None))
        self.out.print(table)


# ---- what every command ends with ----------------------------------------------------------


def wrote(term: Terminal, rendered: Rendered, extra: Sequence[Path] = (),
          as_json: bool = False) -> int:
    """The headline and the files the run wrote (on stderr after --json, so stdout stays
    JSON); returns the exit code the run stands for."""
    files = [*rendered.files, *extra]
    term.show_hosts(rendered.hosts)
    if as_json:
        term.json(rendered.summary)
        for path in files:
            term.note(f"wrote {path}")
        return rendered.exit_code
    style = {0: "green", 1: "bold red", 3: "bold yellow", 4: "yellow"}.get(rendered.exit_code)
    term.print(rendered.headline, style=style)
    finding = rendered.summary.get("finding") or {}
    if finding.get("proof"):
        term.print(f"proof: {finding['proof']}")
    if finding.get("next_action") and finding.get("status") != "healthy":
        term.print(f"next: {finding['next_action']}")
    term.print(f"report: {rendered.report}")
    for path in files:
        if path != rendered.report:
            term.print(f"wrote: {path}")
    term.print(f"raw data: {rendered.report.parent} (records and trial files, not redacted)")
    return rendered.exit_code


# ---- progress of trials -------------------------------------------------------------------


PHASE_WORDS = {"build": "building the model", "forward": "forward", "backward": "backward",
               "optimizer": "optimizer step"}


def activity(event: Mapping[str, Any]) -> str:
    """What the latest heartbeat event (nsadiag.harness.heartbeat) says the run is doing,
    in words: "forward of layers.3 (step 2)", "step 2 done", "waiting in f (x.py:9)"."""
    kind, phase = event.get("kind"), event.get("phase")
    step = f" (step {event['step'] + 1})" if isinstance(event.get("step"), int) else ""
    if kind == "module" and event.get("module"):
        return f"{phase or 'running'} of {event['module']}{step}"
    if kind == "start":
        return PHASE_WORDS.get(phase or "", "starting") + ("" if phase == "build" else step)
    if kind == "step" and isinstance(event.get("step"), int):
        return f"step {event['step'] + 1} done"
    if kind == "end":
        return "finished" if event.get("status") != "error" else "ended with an error"
    if kind == "collective":
        number = f" #{event['n']}" if event.get("n") is not None else ""
        return f"{event.get('op') or 'collective'}{number}{step}"
    if kind == "pulse":
        where = f" in {event['frame']}" if event.get("frame") else ""
        return f"running{where}" if event.get("progress") else f"no progress{where}"
    return "running"


def branch_label(branches: Sequence[str] | None) -> str:
    """Which branches a trial ran, for a sweep that compares branches: "all branches", or
    "sel only" for a trial that ran only some."""
    return f"{','.join(branches)} only" if branches else "all branches"


class Follow:
    """Follows trials: a live bar with the running trial's heartbeats on a terminal, one
    line per trial and stage elsewhere. ``by_branch``: each line says which branches the
    trial ran (isolate-branch runs every layer count twice)."""

    def __init__(self, term: Terminal, total: int | None, plain: bool = False,
                 by_branch: bool = False):
        self.term, self.total, self.by_branch = term, total, by_branch
        self.plain = plain or not term.live
        self.progress, self.task = None, None
        self.trial = "starting"

    def __enter__(self) -> Follow:
        if not self.plain:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            columns = [TextColumn("{task.description}"), BarColumn()]
            if self.total is not None:
                columns.append(TextColumn("{task.completed}/{task.total}"))
            self.progress = Progress(*columns, TimeElapsedColumn(), console=self.term.err,
                                     transient=True)
            self.progress.__enter__()
            self.task = self.progress.add_task("starting", total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def on_trial(self, point: int, spec: TrialSpec) -> None:
        label = f", {branch_label(spec.branches)}" if self.by_branch else ""
        text = f"{spec.n_layers or '-'} layers, S={spec.seq_len}{label}"
        self.trial = text
        if self.progress is None:
            self.term.note(f"  running {text}")
        else:
            self.progress.update(self.task, description=text)

    def on_events(self, events: list[dict]) -> None:
        if self.progress is not None and events:
            self.progress.update(self.task, description=f"{self.trial}: {activity(events[-1])}")

    def on_record(self, record: TrialRecord) -> None:
        label = f"{branch_label(record.spec.branches):<14} " if self.by_branch else ""
        line = (f"  {record.spec.n_layers or '-':>3} layers  "
                f"S={record.spec.seq_len!s:<6} {label}{record.verdict_name:<16} "
                f"{record.wall_s:6.1f} s  {Path(record.trial_dir).name}")
        if self.progress is None:
            self.term.note(line)
        else:
            self.progress.console.print(clean(line), markup=False, highlight=False)
            self.progress.advance(self.task)

    def on_stage(self, stage: str) -> None:
        self.term.note(f"{'triage: ' if self.progress is None else ''}{stage}")


# ---- tables of the commands that print more than a headline ---------------------------------


def mib(n: float | None) -> str:
    return "-" if n is None else mib_of(n, ".1f")


def env_table(term: Terminal, report: Mapping[str, Any]) -> None:
    rows = []
    for key, value in report.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = "; ".join(map(str, value)) or ("none found" if key == "problems" else "-")
        rows.append((key, value))
    term.table(("item", "value"), rows, plain=True)


def self_test_table(term: Terminal, rows: Sequence[Mapping[str, Any]]) -> None:
    term.table(("zoo entry", "expected", "diagnosed", "s", "first reason"),
               [(r["entry"], r["expected"], r["got"], f"{r['seconds']:.0f}", r["reason"])
                for r in rows], ["green" if r["match"] else "red" for r in rows])
    term.print(f"{sum(r['match'] for r in rows)} of {len(rows)} verdicts right")


def memory_tables(term: Terminal, summary: Mapping[str, Any], top: int) -> None:
    term.print(f"saved for backward by the first forward: {mib(summary['saved_total'])}")
    term.table(("module", "saved"), [(name, mib(size)) for name, size in
                                     list(summary["saved_by_module"].items())[:top]])
    if summary["saved_by_branch"]:
        term.print("by NSA branch: " + ", ".join(
            f"{b} {mib(n)}" for b, n in summary["saved_by_branch"].items()))
    standouts = set(summary["layer_standouts"])
    term.table(("layer", "saved for backward", "CUDA allocated delta"),
               [(r["layer"], mib(r["saved"]), mib(r["cuda_delta"]))
                for r in summary["per_layer"]],
               ["bold red" if r["layer"] in standouts else None for r in summary["per_layer"]])
    for name in summary["layer_standouts"]:
        term.print(f"stands out: {name} saves more than 4x the median layer", style="bold red")
    term.table(("largest saved tensors", "shape", "dtype", "size"),
               [(e["module"], e["shape"], e["dtype"], mib(e["nbytes"]))
                for e in summary["largest_saved"]])
    term.print(f"peak RSS: {mib(summary['peak_rss'])}, step {summary['step_s']:.3f} s")
    cuda = summary["cuda"]
    term.print(cuda if isinstance(cuda, str) else ", ".join(f"{k} {v}" for k, v in cuda.items()))
    history = summary["history"]
    if "unavailable" in history:
        term.print(history["unavailable"])
    else:
        found = history["summary"]
        term.table(("allocation site (live at peak)", "bytes", "blocks"),
                   [(s["site"], mib(s["bytes"]), s["blocks"]) for s in found["top_sites"]])
        term.print(f"segments {found['segments']}: reserved {mib(found['reserved'])}, "
                   f"allocated {mib(found['allocated'])}, {found['free_blocks']} free blocks, "
                   f"largest free block {mib(found['largest_free_block'])}, fragmentation "
                   f"{found['fragmentation']:.2f}; snapshot: {history['snapshot']} "
                   f"(open in https://pytorch.org/memory_viz)")
    if isinstance(summary.get("gpu"), str):
        term.print(summary["gpu"])
    ab = summary.get("ab_expandable_segments")
    if ab:
        term.table(("quantity", "default", "expandable_segments:True", "change"),
                   [(r["quantity"], mib(r["baseline"]) if r["unit"] == "bytes"
                     else r["baseline"], mib(r["expandable"]) if r["unit"] == "bytes"
                     else r["expandable"], "-" if r["change"] is None else f"x{r['change']:.2f}")
                    for r in ab["rows"]])


def trace_tables(term: Terminal, summary: Mapping[str, Any]) -> None:
    term.table(("module", "phase", "start ms", "duration ms"),
               [(s["module"], s["phase"], f"{s['start_us'] / 1000:.1f}",
                 f"{s['duration_us'] / 1000:.1f}") for s in summary["timeline"][:15]])
    for key in ("unused_parameters", "repeated_gradients", "unfinished_backward"):
        term.print(f"{key.replace('_', ' ')}: {summary[key] or 'none'}")
    term.print(f"step {summary['step_s_untraced']:.3f} s untraced, "
               f"{summary['step_s_traced']:.3f} s traced ({summary['overhead_pct']:+.1f}%), "
               f"{summary['events']} events")


def check_table(term: Terminal, summary: Mapping[str, Any]) -> None:
    checks = summary["checks"]
    term.table(("check", "verdict", "module", "summary"),
               [(c["name"], c["status"], c["module"] or "-", c["summary"]) for c in checks],
               ["green" if c["passed"] else "red" if c.get("failed", True) else "yellow"
                for c in checks])


def stacks_tables(term: Terminal, summary: Mapping[str, Any]) -> None:
    """One row per process, then every thread that matters in its last sample (the main
    thread, running threads, threads in the user's code: one blocked on a lock too)."""
    term.table(("pid", "rank", "state", "CPU", "innermost frames"),
               [(p["pid"], "-" if p["rank"] is None else p["rank"], p["state"],
                 "-" if p["cpu_fraction"] is None else f"{100 * p['cpu_fraction']:.0f}%",
                 p["signature"] or "; ".join(p["unavailable"]))
                for p in summary["processes"]])
    for pid in summary["odd_ones_out"]:
        term.print(f"odd one out: pid {pid} differs from the rest", style="bold red")
    for proc in summary["processes"]:
        if not proc["threads"]:
            continue
        others = f", {proc['other_threads']} idle library thread(s) not shown" \
            if proc["other_threads"] else ""
        term.print(f"pid {proc['pid']}: {len(proc['threads'])} thread(s){others}", style="bold")
        for thread in proc["threads"]:
            state = "running" if thread["active"] else "idle"
            waiting = f", waiting in {thread['waiting_in']}" if thread["waiting_in"] else ""
            term.print(f"  thread {thread['name']} ({state}{waiting})")
            for frame in thread["frames"][:6]:
                term.print(f"    {frame}")


def _noise_cell(delta: Mapping[str, Any]) -> str:
    """The measured spread, and for a slowdown the machine explains, the change of the
    step time over its expected cost."""
    noise = f"±{delta['noise']:.0%}" if delta.get("noise") is not None else "-"
    if delta.get("explained"):
        noise += f"; vs expected cost {delta['cost_change']:+.0%}: the machine"
    return noise


def compare_tables(term: Terminal, result: Mapping[str, Any], threshold: float) -> None:
    for change in result["verdict_changes"]:
        layers = f" {change['n_layers']} layers" if change["n_layers"] else ""
        worse = " (a failure now)" if change.get("failure_now") else ""
        term.print(f"{change['label'] or '-'}{layers}: {change['before']} -> "
                   f"{change['after']}{worse}")
    for difference in result["config_differences"]:
        term.print(f"configurations differ (forced): {difference}")
    term.table(("run", "layers", "quantity", "before", "after", "change", "noise"),
               [(d["label"] or "-", d["n_layers"], d["quantity"], f"{d['before']:.4g}",
                 f"{d['after']:.4g}", f"{d['change']:+.0%}", _noise_cell(d))
                for d in result["deltas"]],
               ["red" if d["regressed"] else "green" for d in result["deltas"]])
    failures = sum(1 for change in result["verdict_changes"] if change.get("failure_now"))
    term.print(f"{len(result['regressions'])} regression(s) above +{100 * threshold:.0f}%"
               + (f"; {failures} verdict(s) that failed where they had not" if failures
                  else ""))
