"""nsadiag env --self-test: diagnose every fault-zoo entry and compare with its expected
verdict, so a user can see that the toolkit decides right on this machine. An entry whose
settings name a "check" is diagnosed by that correctness check instead of a trial."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from nsadiag.checks import run_check
from nsadiag.harness.jobs import run_trial
from nsadiag.spec import TrialSpec
from repro import ZOO


def self_test(only: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per zoo entry: expected and diagnosed verdict, first reason, seconds."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="nsadiag-selftest-") as tmp:
        for name, (expected, settings) in ZOO.items():
            if only and name not in only:
                continue
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
    return rows
