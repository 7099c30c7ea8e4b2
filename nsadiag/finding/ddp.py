"""The finding of `nsadiag ddp`: its one trial's (nsadiag.finding.trial: the odd rank's
line, the proof, the next step), with the world size and the backend in its subject, and
the `nsadiag ddp` command that reruns it."""

from __future__ import annotations

import shlex

from nsadiag.finding.commands import trial_options
from nsadiag.finding.trial import trial_finding
from nsadiag.findingdata import Finding
from nsadiag.rundir import TrialRecord


def ddp_rerun(record: TrialRecord) -> list[str]:
    """The `nsadiag ddp` command of this trial."""
    ddp = record.evidence.ddp if record.evidence is not None else None
    return ["nsadiag", "ddp", "--world-size", str(ddp.world_size if ddp else None),
            "--ddp-backend", str(ddp.backend if ddp else None), *trial_options(record.spec)]


def ddp_finding(record: TrialRecord) -> Finding:
    """The finding of a DDP job's record (decided once: by `nsadiag ddp` as the job ends,
    or for a run directory that kept none, as its report is rendered)."""
    ddp = record.evidence.ddp if record.evidence is not None else None
    world_size, backend = (ddp.world_size, ddp.backend) if ddp else (None, None)
    finding = trial_finding(record, "ddp", shlex.join(ddp_rerun(record)))
    finding.subject += f", {world_size} ranks ({backend})"
    return finding
