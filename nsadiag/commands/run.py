"""nsadiag run -- CMD: the user's own command, watched to a verdict, then the report.

The watching is nsadiag.harness.runcmd.run_command; this module checks the limits and the
command, decides the run's finding once (nsadiag.finding.run.with_finding), keeps the record
with it (record.json) and run.json, and renders report.md and summary.json from that record
in hand (nsadiag.report.run), without reading record.json back. A command that is refused
(no command, not found, a directory, not executable, bad limits) leaves no run directory
behind.

A --out that holds an earlier run is not touched until the new run has its verdict: the
earlier run's files are set aside (nsadiag.rundir.prepare_fresh_run_dir) and removed once
record.json of the new one is written; a run that ends without a verdict (interrupted,
refused at start) puts them back. Only nsadiag's own files move: the user's files beside a
run stay, and a --out that holds the user's files but no run is refused untouched
(nsadiag.store.owned). An earlier run that an nsadiag killed with SIGKILL left set aside
(``.nsadiag-earlier-*`` in the directory) is named at the start and removed with the
earlier run. When the full report cannot be written (a full disk even after the reserve), a
short one with the verdict is, and the error says the verdict.

A run the user interrupts (Ctrl-C, SIGTERM, SIGHUP) is kept like a finished one: its
record (INCONCLUSIVE with when it was stopped, or the verdict already decided), run.json,
report.md and summary.json are written, then ``stop.Kept`` carries the report to the
command line, which shows it and exits 128 + the signal. A second signal while that is
written ends it, and the earlier run is put back.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

from nsadiag.finding.run import with_finding
from nsadiag.harness import stop
from nsadiag.harness.echo import LiveStatus
from nsadiag.harness.runcmd import check_command, run_command
from nsadiag.redact import Redactor
from nsadiag.report.dispatch import Rendered, render_record
from nsadiag.rundir import (
    TrialRecord,
    discard_on_refusal,
    drop_left_aside,
    left_aside,
    prepare_fresh_run_dir,
    stored_redaction,
    write_json,
    write_run_meta,
    write_text,
)
from nsadiag.store.owned import drop_earlier, restore_earlier


def run_user_command(command: Sequence[str], run_dir: Path, argv: Sequence[str],
                     stall_timeout_s: float, deadline_s: float, no_redact: bool = False,
                     on_start: Callable[[str], None] | None = None,
                     on_note: Callable[[str], None] | None = None,
                     live: LiveStatus | None = None) -> Rendered:
    """Watch ``command`` (see nsadiag.harness.runcmd) in ``run_dir``; returns what the
    report wrote. ValueError (one line) for a refused command or limit; ``on_start``
    hears what is watched once the command is accepted, ``on_note`` what went missing
    (copies of the output a full disk cut short, output the terminal did not show);
    ``live`` is the status line kept below the command's output on a terminal."""
    for name, value in (("stall-timeout", stall_timeout_s), ("deadline", deadline_s)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: must be a positive number of seconds, got {value:g}")
    check_command(list(command))
    for stale in left_aside(run_dir):
        if on_note:
            on_note(f"nsadiag run: an earlier run of {run_dir}, set aside by an nsadiag "
                    f"that was killed, is in {stale}; it is removed once this run has its "
                    f"verdict")
    with discard_on_refusal(run_dir):
        # refuses while another nsadiag holds the directory; sets an earlier run aside
        earlier = prepare_fresh_run_dir(run_dir)
        try:
            if on_start:
                on_start(f"watching {shlex.join(command)}")
            record = with_finding(
                run_command(list(command), run_dir, stall_timeout_s, deadline_s, live))
            _keep_record(record, run_dir, argv, stall_timeout_s, deadline_s)
        except BaseException:
            restore_earlier(run_dir, earlier)
            raise
    drop_earlier(earlier)
    drop_left_aside(run_dir)
    evidence = record.evidence
    copies = [*(evidence.output_copies or []), *(evidence.heartbeats_lost or [])] \
        if evidence is not None else []
    not_shown = (evidence.output_not_shown if evidence is not None else None) or {}
    for line in [*copies, *_not_shown(not_shown, run_dir, copies)]:
        if on_note:
            on_note(f"nsadiag run: {line}")
    try:
        rendered = render_record(record, run_dir, no_redact)
    except ValueError as err:
        _short_report(record, run_dir, no_redact, str(err))
        raise ValueError(f"{err}; the verdict: {_headline(record)} (a short report is in "
                         f"{run_dir / 'report.md'})") from None
    if evidence is not None and evidence.interrupted:
        raise stop.Kept(rendered)
    return rendered


def _not_shown(counts: dict[str, int], run_dir: Path, copies: list[str]) -> list[str]:
    """One line per output the terminal did not keep up with (``copies``: the lines that
    say a kept copy is incomplete, each starting with its file's name)."""
    cut = {line.split(":", 1)[0] for line in copies}
    return [f"{count} bytes of the command's output were not shown in the terminal (it "
            f"did not keep up); {'what was kept' if name in cut else 'all of it'} is in "
            f"{run_dir / name}" for name, count in counts.items()]


def _keep_record(record: TrialRecord, run_dir: Path, argv: Sequence[str],
                 stall_timeout_s: float, deadline_s: float) -> None:
    """run.json (with the limits the run was watched under, as the watch wrote it first)
    and record.json; ValueError (one line, with the verdict) when they cannot be
    written."""
    try:
        write_run_meta(run_dir, "run", list(argv), stall_timeout_s=stall_timeout_s,
                       deadline_s=deadline_s)
        write_json(run_dir / "record.json", record.to_dict())
    except ValueError as err:
        raise ValueError(f"{err}; the verdict: {_headline(record)}") from None


def _headline(record: TrialRecord) -> str:
    verdict = record.verdict
    return f"{verdict.name}: {(verdict.reasons or [''])[0]}"


def _short_report(record: TrialRecord, run_dir: Path, no_redact: bool, why: str) -> None:
    """report.md with the verdict and its reasons only (best effort)."""
    verdict = record.verdict
    lines = [f"# nsadiag run: {verdict.name}", "",
             f"`{shlex.join(record.spec.command or ())}`", "",
             *[f"- {reason}" for reason in verdict.reasons], "",
             f"The full report could not be written: {why}", ""]
    text = "\n".join(lines)
    if not no_redact:
        text = Redactor.with_recorded(stored_redaction(run_dir)).text(text)
    try:
        write_text(run_dir / "report.md", text)
    except ValueError:
        pass
