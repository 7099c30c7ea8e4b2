"""nsadiag ddp: one trial under torchrun with N ranks, watched per rank, decided across ranks.

The job runs through nsadiag.harness.jobs.run_ddp_trial (each rank a child of
nsadiag.harness.child under torchrun, one heartbeat per rank, collectives counted); this
module checks that the options can run here (before anything is written), keeps the record
and the finding decided from it once (nsadiag.finding.ddp, in finding.json), and renders the
report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from nsadiag.finding.ddp import ddp_finding
from nsadiag.harness.jobs import run_ddp_trial
from nsadiag.preflight import check_ddp, check_target
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.rundir import (
    append_record,
    forget_finding,
    keep_finding,
    prepare_run_dir,
    write_run_meta,
    write_text,
)
from nsadiag.spec import TrialSpec


def ddp_command(base: TrialSpec, world_size: int, ddp_backend: str, run_dir: Path,
                argv: Sequence[str], pg_timeout_s: float | None = None,
                on_events: Callable[[list[dict]], None] | None = None,
                no_redact: bool = False,
                on_start: Callable[[str], None] | None = None) -> Rendered:
    """Check, run one DDP trial into run_dir/trial-0 (``on_start`` hears when it starts),
    keep its record, render the report; returns what the report wrote."""
    from nsadiag.envinfo import collect_env

    check_ddp(base, world_size, ddp_backend, pg_timeout_s)
    check_target(base)
    prepare_run_dir(run_dir)
    write_run_meta(run_dir, "ddp", list(argv), env=collect_env().as_dict(),
                   world_size=world_size, ddp_backend=ddp_backend,
                   spec=json.loads(base.to_json()))
    write_text(run_dir / "spec.json", base.to_json())
    trials = run_dir / "trials.jsonl"
    if trials.exists():
        trials.unlink()  # one trial per run: a rerun replaces it, and its finding
    forget_finding(run_dir)
    if on_start:
        on_start(f"{world_size} ranks ({ddp_backend}) under torchrun")
    record = run_ddp_trial(base.replace(out_dir=str(run_dir / "trial-0")), world_size,
                           ddp_backend, pg_timeout_s=pg_timeout_s, on_events=on_events)
    append_record(trials, record)
    keep_finding(run_dir, ddp_finding(record))  # decided once, as the job ends
    return render_run(run_dir, no_redact)
