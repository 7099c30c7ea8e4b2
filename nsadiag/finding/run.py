"""The finding of `nsadiag run` and of a block under ``nsadiag.watch()``, decided once.

``with_finding(record)`` is called where the command has its record (nsadiag.commands.run
and .watch), before record.json is written: the record then carries its Finding
(nsadiag.rundir.TrialRecord.finding) and every report of it renders that one. A
record.json written before findings were stored gets its finding here too, once, where the
report loads it (nsadiag.report.dispatch).
"""

from __future__ import annotations

import dataclasses
import math
import shlex

from nsadiag.finding import Finding
from nsadiag.finding.straggler import with_straggler
from nsadiag.finding.trial import trial_finding
from nsadiag.rundir import TrialRecord


def run_finding(record: TrialRecord) -> Finding:
    """The finding of one run or watched block, with the command that repeats it."""
    spec = record.spec
    kind = spec.kind or "run"
    rerun = (f"nsadiag run --stall-timeout {spec.stall_timeout_s:g} --deadline "
             f"{rerun_deadline(record):g} -- {shlex.join(spec.command or ())}"
             if kind == "run" else None)
    # the straggler a host saw while the job ran (its record's hosts), or the one the
    # verdict over every host's ranks found in their recorded steps
    hosts = record.evidence.hosts if record.evidence is not None else None
    decided = record.verdict.facts.ranks.straggler
    straggler = (hosts or {}).get("straggler") or (decided.to_dict() if decided else None)
    return with_straggler(trial_finding(record, kind, rerun), straggler)


def rerun_deadline(record: TrialRecord) -> float:
    """The --deadline a rerun is given: the run's own, but for a SLOW that nothing but time
    stopped (no defect, no cause class to fix first), a longer one: twice the run's, or
    past its ETA when it has one, so the rerun is not cut off where this one was."""
    deadline = float(record.spec.deadline_s or 0)
    facts = record.verdict.facts
    cause = facts.slow.slow_cause
    if record.verdict_name != "SLOW" or facts.slow.slow_by == "defect" or \
            (cause is not None and cause.kind != "model-compute") or not deadline:
        return deadline
    wanted = 2 * deadline
    if facts.slow.eta_s:
        wanted = max(wanted, record.wall_s + 1.5 * facts.slow.eta_s)
    return float(math.ceil(wanted / 60) * 60) if wanted > 120 else float(math.ceil(wanted))


def with_finding(record: TrialRecord) -> TrialRecord:
    """``record`` with its finding (``run_finding``) stored in it."""
    return dataclasses.replace(record, finding=run_finding(record))
