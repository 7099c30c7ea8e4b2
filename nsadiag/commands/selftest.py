"""nsadiag env --self-test: diagnose every fault-zoo entry and compare with its expected
verdict, so a user can see that the toolkit decides right on this machine. An entry whose
settings name a "check" is diagnosed by that correctness check instead of a trial.

The zoo (``repro/``) lies beside ``nsadiag/`` in nsa-diag's repository and is not
installed (a top-level ``repro`` in site-packages would shadow a user's package of that
name): the self-test runs from a checkout, or an editable install of one, and puts the
checkout on the path of this process and of its trials while it runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nsadiag.checks import CheckResult, run_check
from nsadiag.harness.jobs import run_trial
from nsadiag.rundir import TrialRecord
from nsadiag.spec import TrialSpec

CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository nsadiag was installed from, when it was installed from one."""
ZOO: dict[str, Any] | None = None
"""{entry: (expected verdict, trial settings)}; None: read repro.ZOO from the checkout."""


@contextlib.contextmanager
def zoo_on_path() -> Iterator[dict[str, Any]]:
    """The zoo, with the checkout first on sys.path and PYTHONPATH while the block runs;
    ValueError (one line) when nsadiag was not installed from a checkout."""
    if not (CHECKOUT / "repro" / "__init__.py").is_file():
        raise ValueError("self-test: the fault zoo (repro/) ships with nsa-diag's "
                         "repository, not with the installed package: run nsadiag env "
                         "--self-test from a checkout (pip install -e .)")
    before_path, before_env = list(sys.path), os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(CHECKOUT))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [before_env])])
    try:
        yield ZOO if ZOO is not None else importlib.import_module("repro").ZOO
    finally:
        sys.path[:] = before_path
        if before_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before_env


def self_test(only: list[str] | None = None,
              on_entry: Callable[[str, int, int], None] | None = None,
              on_row: Callable[[dict[str, Any]], None] | None = None,
              on_result: Callable[[str, TrialRecord | CheckResult], None] | None = None,
              ) -> list[dict[str, Any]]:
    """One row per zoo entry: expected and diagnosed verdict, first reason, seconds.
    ``on_entry`` hears (entry, index, count) before each entry runs, ``on_row`` each row,
    ``on_result`` each entry's trial record or check result (what its finding is made of)."""
    rows = []
    with zoo_on_path() as zoo, tempfile.TemporaryDirectory(prefix="nsadiag-selftest-") as tmp:
        entries = [(name, entry) for name, entry in zoo.items() if not only or name in only]
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
                if on_result:
                    on_result(name, result)
            else:
                record = run_trial(spec)
                got, reason = record.verdict_name, record.verdict.reasons[0]
                if on_result:
                    on_result(name, record)
            rows.append({"entry": name, "expected": expected, "got": got,
                         "match": got == expected, "reason": reason,
                         "seconds": time.monotonic() - started})
            if on_row:
                on_row(rows[-1])
    return rows
