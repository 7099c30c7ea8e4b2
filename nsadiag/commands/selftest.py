"""nsadiag env --self-test: diagnose every fault-zoo entry and compare with its expected
verdict, so a user can see that the toolkit decides right on this machine."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from nsadiag.runner import run_trial
from nsadiag.spec import TrialSpec
from repro import ZOO


def self_test(only: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per zoo entry: expected and diagnosed verdict, first reason, seconds."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="nsadiag-selftest-") as tmp:
        for name, (expected, settings) in ZOO.items():
            if only and name not in only:
                continue
            spec = TrialSpec(target=f"repro.{name}:make", out_dir=str(Path(tmp) / name),
                             **{"budget_s": 60.0, **settings}).validate()
            started = time.monotonic()
            record = run_trial(spec)
            rows.append({"entry": name, "expected": expected, "got": record.verdict_name,
                         "match": record.verdict_name == expected,
                         "reason": record.verdict["reasons"][0],
                         "seconds": time.monotonic() - started})
    return rows
