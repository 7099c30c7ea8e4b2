"""nsadiag ddp: one trial under torchrun with N ranks, watched per rank, decided across ranks.

The job runs through nsadiag.harness.jobs.run_ddp_trial (each rank a child of
nsadiag.harness.child under torchrun, one heartbeat per rank, collectives counted); this
module checks that the options can run here, keeps the record and renders the report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from nsadiag.commands.sweep import check_target
from nsadiag.harness.jobs import run_ddp_trial
from nsadiag.harness.rank import DDP_BACKENDS
from nsadiag.rundir import append_record, prepare_run_dir
from nsadiag.spec import TrialSpec


def check_ddp(spec: TrialSpec, world_size: int, backend: str) -> None:
    """ValueError (one line) for a world size, backend or device that cannot run here."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world-size: must be an integer >= 1, got {world_size!r}")
    if backend not in DDP_BACKENDS:
        raise ValueError(f"backend: must be one of {', '.join(DDP_BACKENDS)}, got {backend!r}")
    if backend == "gloo":
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError("backend: nccl needs CUDA, and torch.cuda.is_available() is False "
                         "on this machine; use --backend gloo")
    if spec.device == "cpu":
        raise ValueError("device: nccl runs on CUDA tensors; use --device cuda or auto")
    if world_size > torch.cuda.device_count():
        raise ValueError(f"world-size: nccl needs one GPU per rank, and this machine has "
                         f"{torch.cuda.device_count()} (asked for {world_size})")


def ddp_command(base: TrialSpec, world_size: int, backend: str, run_dir: Path,
                argv: Sequence[str], pg_timeout_s: float | None = None,
                on_events: Callable[[list[dict]], None] | None = None) -> Path:
    """Check, run one DDP trial into run_dir/trial-0, keep its record, render the report;
    returns the report path."""
    from nsadiag.envinfo import collect_env
    from nsadiag.render import render_run

    check_ddp(base, world_size, backend)
    check_target(base)
    prepare_run_dir(run_dir)
    meta = {"command_name": "ddp", "argv": list(argv), "env": collect_env().as_dict(),
            "world_size": world_size, "backend": backend}
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    (run_dir / "spec.json").write_text(base.to_json())
    trials = run_dir / "trials.jsonl"
    if trials.exists():
        trials.unlink()  # one trial per run: a rerun replaces it
    record = run_ddp_trial(base.replace(out_dir=str(run_dir / "trial-0")), world_size,
                           backend, pg_timeout_s=pg_timeout_s, on_events=on_events)
    append_record(trials, record)
    return render_run(run_dir)
