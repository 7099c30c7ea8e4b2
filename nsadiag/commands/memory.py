"""nsadiag memory: run a few training steps of a target and report what each module, NSA
branch and layer saves for backward, the largest saved tensors, peak RSS and, on CUDA,
the allocator's counters, a recorded memory history (snapshot.pickle) and its summary.

`memory_run` is the command: it checks the options before anything is written, measures
(`memory_command`, in this process), decides the finding once
(nsadiag.finding.measured.memory_finding), keeps memory.json with it under ``finding`` and
renders report.md, memory.png and summary.json (nsadiag.report.memory).
`ab_expandable_segments` measures twice more, each time as a "memory" job in a fresh
watched child (nsadiag.harness.jobs): once with the allocator configuration of this process
minus `expandable_segments`, once with `expandable_segments:True` added. The variable is
set in the child's environment only; the allocator reads it when CUDA initialises, so it
cannot be switched inside a process that already used CUDA.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nsadiag.finding.measured import memory_finding
from nsadiag.harness.jobs import run_job
from nsadiag.harness.memory import measure_steps
from nsadiag.harness.targetcheck import require_importable
from nsadiag.memoryrecord import MemoryRecord
from nsadiag.preflight import check_device, check_target
from nsadiag.recordspec import RecordSpec
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.rundir import prepare_run_dir, write_json, write_run_meta
from nsadiag.spec import JobSpec, TrialSpec
from nsadiag.targets import resolve_device

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
CHILD_TIMEOUT_S = 600


def memory_command(spec: TrialSpec, out_dir: Path | None = None, top: int = 10
                   ) -> dict[str, Any]:
    """spec.steps steps in this process (nsadiag.harness.memory.measure_steps); the summary
    also goes to out_dir/memory.json, and on CUDA the memory history to
    out_dir/snapshot.pickle. A user's target is first imported in a watched child
    (require_importable)."""
    require_importable(spec)
    summary = measure_steps(spec, out_dir, top)
    if out_dir is not None:
        write_json(Path(out_dir) / "memory.json", summary)
    return summary


def memory_run(spec: TrialSpec, run_dir: Path, argv: Sequence[str], top: int = 10,
               ab: bool = False, no_redact: bool = False,
               on_start: Callable[[str], None] | None = None) -> Rendered:
    """`nsadiag memory`: check the target, the device (and CUDA for ``ab``) before the run
    directory exists, measure (``on_start`` hears when and what), keep memory.json (with
    the A/B when ``ab``), render."""
    if top < 1:
        raise ValueError(f"top: must be >= 1, got {top}")
    check_device(spec)
    if ab:
        require_cuda(spec)
    check_target(spec)
    prepare_run_dir(run_dir)
    write_run_meta(run_dir, "memory", list(argv), spec=json.loads(spec.to_json()))
    if on_start:
        on_start(f"measuring {spec.steps} step(s) of {spec.target}, S={spec.seq_len}, "
                 f"{spec.device}")
    summary = memory_command(spec, run_dir, top)
    if ab:
        if on_start:
            on_start("the expandable-segments A/B: two more children")
        summary["ab_expandable_segments"] = ab_expandable_segments(spec, run_dir, top)
    summary["finding"] = memory_finding(MemoryRecord.from_dict(summary),
                                        RecordSpec.from_dict(json.loads(spec.to_json())))\
        .to_dict()
    write_json(run_dir / "memory.json", summary)
    return render_run(run_dir, no_redact)


def alloc_conf(current: str | None, expandable: bool) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF with expandable_segments removed, then set to True when
    `expandable`; None when nothing is left (the variable is then unset)."""
    entries = [e.strip() for e in (current or "").split(",") if e.strip()]
    kept = [e for e in entries if e.split(":", 1)[0].strip() != "expandable_segments"]
    if expandable:
        kept.append("expandable_segments:True")
    return ",".join(kept) or None


def _measure_in_child(spec: TrialSpec, top: int, expandable: bool,
                      out_dir: Path) -> dict[str, Any]:
    """The memory job in a watched child whose allocator configuration has expandable
    segments off or on."""
    value = alloc_conf(os.environ.get(ALLOC_CONF), expandable)
    label = "expandable" if expandable else "default"
    job = JobSpec("memory", spec.replace(out_dir=str(out_dir / f"ab-{label}"),
                                         budget_s=CHILD_TIMEOUT_S), top=top)
    record = run_job(job, env={ALLOC_CONF: value})
    result = record.evidence.result if record.evidence is not None else None
    measured = (result or {}).get("memory")
    if record.verdict_name != "OK" or measured is None:
        reason = record.verdict.reasons[0] if record.verdict.reasons else ""
        raise RuntimeError(f"ab-expandable-segments: the measuring child "
                           f"(expandable_segments={expandable}) ended {record.verdict_name}: "
                           f"{reason}")
    return measured


def ab_expandable_segments(spec: TrialSpec, out_dir: Path, top: int = 10) -> dict[str, Any]:
    """The measurement without and with expandable segments, each in a fresh child (its
    files in out_dir/ab-default and out_dir/ab-expandable), and the comparison rows.
    ValueError when the spec's device is not CUDA."""
    require_cuda(spec)
    baseline = _measure_in_child(spec, top, False, out_dir)
    expandable = _measure_in_child(spec, top, True, out_dir)
    return {"baseline": baseline, "expandable": expandable,
            "rows": compare_ab(baseline, expandable)}


def require_cuda(spec: TrialSpec) -> None:
    """ValueError (one line) unless the spec's device resolves to CUDA."""
    device = resolve_device(spec.device)
    if device.type != "cuda":
        raise ValueError(f"ab-expandable-segments: needs a CUDA device (--device cuda); "
                         f"this run's device is {device.type}")


AB_QUANTITIES = (("reserved", "bytes"), ("allocated", "bytes"), ("fragmentation", "ratio"),
                 ("peak_allocated", "bytes"), ("peak_reserved", "bytes"),
                 ("num_alloc_retries", "count"), ("largest_free_block", "bytes"))


def compare_ab(baseline: dict[str, Any], expandable: dict[str, Any]) -> list[dict[str, Any]]:
    """{quantity, unit, baseline, expandable, change} rows; change is expandable/baseline
    (None when the baseline is 0 or a value is missing)."""
    rows = []
    pairs = [(q, unit, baseline["cuda"].get(q), expandable["cuda"].get(q))
             for q, unit in AB_QUANTITIES]
    pairs.append(("step_s", "seconds", baseline.get("step_s"), expandable.get("step_s")))
    for quantity, unit, a, b in pairs:
        numeric = isinstance(a, (int, float)) and isinstance(b, (int, float))
        rows.append({"quantity": quantity, "unit": unit, "baseline": a, "expandable": b,
                     "change": b / a if numeric and a else None})
    return rows

