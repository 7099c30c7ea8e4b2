"""nsadiag: tells slow from stuck and wrong from fast in PyTorch training runs.

``nsadiag.watch(...)`` watches a block of the caller's own code (nsadiag.commands.watch).
``nsadiag.load_trials(run_dir)`` reads a run directory's trials as a pandas DataFrame
(nsadiag.trials); the schemas of summary.json and trials.jsonl ship in nsadiag/schemas
(nsadiag.schema). Importing this package imports nothing heavy: the command line's help
must not wait for torch or pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nsadiag.spec import STALL_TIMEOUT_S

if TYPE_CHECKING:
    from pathlib import Path

    from nsadiag.commands.watch import WatchedBlock

__version__ = "0.1.0"
__all__ = ["__version__", "load_trials", "watch"]


def watch(out: str | Path, stall_timeout: float = STALL_TIMEOUT_S, deadline: float | None = None,
          no_redact: bool = False) -> WatchedBlock:
    """Watch the code inside ``with nsadiag.watch(out="runs/x", stall_timeout=60):`` as
    ``nsadiag run`` watches a command, from a helper process that never stops this one:
    a stall verdict with its evidence and report.md in ``out`` while the block still
    hangs, SLOW at ``deadline`` seconds, else OK or ERROR when the block ends
    (nsadiag.commands.watch)."""
    from nsadiag.commands.watch import WatchedBlock

    return WatchedBlock(out, stall_timeout, deadline, no_redact)


def __getattr__(name: str) -> Any:
    if name == "load_trials":
        from nsadiag.trials import load_trials

        return load_trials
    raise AttributeError(f"module 'nsadiag' has no attribute {name!r}")
