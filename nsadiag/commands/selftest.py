"""nsadiag env --self-test: diagnose every fault-zoo entry and compare with its expected
verdict, so a user can see that the toolkit decides right on this machine. An entry whose
settings name a "check" is diagnosed by that correctness check instead of a trial."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsadiag.checks import run_check
from nsadiag.harness.jobs import run_trial
from nsadiag.spec import TrialSpec
from repro import ZOO


def self_test(only: list[str] | None = None,
              on_entry: Callable[[str, int, int], None] | None = None,
              on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One row per zoo entry: expected and diagnosed verdict, first reason, seconds.
    ``on_entry`` hears (entry, index, count) before each entry runs, ``on_row`` each row."""
    rows = []
    entries = [(name, entry) for name, entry in ZOO.items() if not only or name in only]
    with tempfile.TemporaryDirectory(prefix="nsadiag-selftest-") as tmp:
        for index, (name, (expected, settings)) in enumerate(entries):
            if on_entry:
                on_entry(name, index, len(entries))
            settings = dict(settings)
            check = settings.pop("check", None)
            spec = TrialSpec(target=f"repro.{name}:make", out_dir=str(Path(tmp) / name),
                             **{"budget_s": 60.0, **settings}).validate()
            started = time.monotonic()
            if check:
                result = run_check(check, spec, Path(tmp) / name)
                got, reason = result.verdict.name, result.verdict.reasons[0]
            else:
                record = run_trial(spec)
                got, reason = record.verdict_name, record.verdict["reasons"][0]
            rows.append({"entry": name, "expected": expected, "got": got,
                         "match": got == expected, "reason": reason,
                         "seconds": time.monotonic() - started})
            if on_row:
                on_row(rows[-1])
    return rows
