"""nsadiag: tells slow from stuck and wrong from fast in NSA training runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from nsadiag.commands.watch import Watch

__version__ = "0.1.0"


def watch(out: str | Path, stall_timeout: float = 60.0, deadline: float | None = None,
          no_redact: bool = False) -> Watch:
    """Watch the code inside ``with nsadiag.watch(out="runs/x", stall_timeout=60):`` as
    ``nsadiag run`` watches a command, from a helper process that never stops this one:
    a stall verdict with its evidence and report.md in ``out`` while the block still
    hangs, SLOW at ``deadline`` seconds, else OK or ERROR when the block ends
    (nsadiag.commands.watch)."""
    from nsadiag.commands.watch import Watch

    return Watch(out, stall_timeout, deadline, no_redact)
