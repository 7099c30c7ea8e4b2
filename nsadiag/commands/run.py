"""nsadiag run -- CMD: the user's own command, watched to a verdict, then the report.

The watching is nsadiag.harness.runcmd.run_command; this module checks the limits, keeps
the record (record.json) and run.json, and renders report.md and summary.json
(nsadiag.report.run). A command that is refused (no command, not found, bad limits) leaves
no run directory behind.
"""

from __future__ import annotations

import math
import shlex
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from nsadiag.harness.runcmd import run_command
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.rundir import discard_on_refusal, prepare_run_dir, write_json, write_run_meta


def run_user_command(command: Sequence[str], run_dir: Path, argv: Sequence[str],
                     stall_timeout_s: float, deadline_s: float, no_redact: bool = False,
                     on_start: Callable[[str], None] | None = None) -> Rendered:
    """Watch ``command`` (see nsadiag.harness.runcmd) in ``run_dir``; returns what the
    report wrote. ValueError (one line) for a refused command or limit; ``on_start``
    hears what is watched once the command is accepted."""
    for name, value in (("stall-timeout", stall_timeout_s), ("deadline", deadline_s)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: must be a positive number of seconds, got {value:g}")
    if not command:
        raise ValueError("command: give the command to run after --, e.g. "
                         "nsadiag run -- python train.py")
    if shutil.which(command[0]) is None and not Path(command[0]).exists():
        raise ValueError(f"command: {command[0]!r} not found")
    with discard_on_refusal(run_dir):
        prepare_run_dir(run_dir)  # refuses while another nsadiag holds the directory
        if on_start:
            on_start(f"watching {shlex.join(command)}")
        record = run_command(list(command), run_dir, stall_timeout_s, deadline_s)
    write_run_meta(run_dir, "run", list(argv))
    write_json(run_dir / "record.json", record.to_dict())
    return render_run(run_dir, no_redact)
