"""nsadiag: tells slow from stuck and wrong from fast in NSA training runs.

``nsadiag.load_trials(run_dir)`` reads a run directory's trials as a pandas DataFrame
(nsadiag.trials); the schemas of summary.json and trials.jsonl ship in nsadiag/schemas
(nsadiag.schema). Importing this package imports nothing heavy: the command line's help
must not wait for torch or pandas.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_trials"]


def __getattr__(name: str) -> Any:
    if name == "load_trials":
        from nsadiag.trials import load_trials

        return load_trials
    raise AttributeError(f"module 'nsadiag' has no attribute {name!r}")
