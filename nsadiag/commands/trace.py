"""nsadiag trace: one traced training step of a target in this process: a per-module
forward/backward timeline, gradient arrivals, unused and repeatedly accumulated
parameters, and a Chrome trace (trace.json, opens in Perfetto).

Overhead is measured, not guessed: after one untraced warm-up step, untraced and traced
steps alternate (``spec.steps`` of each: ``--steps``, TIMED_STEPS by default; same
shapes, fresh ids) and the medians compare.
Each step is forward + backward + optimizer step; on CUDA the clock reads are bracketed by
torch.cuda.synchronize() (outside every hook). The report describes the last traced step.

With ``profiler``, one more step runs under torch.profiler with every module's forward and
backward as a record_function range (nsadiag.probes.trace.ProfilerSpans), exported as
profiler-trace.json: operators and modules in one Perfetto trace.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nsadiag.finding.measured import trace_finding
from nsadiag.harness.targetcheck import require_importable
from nsadiag.preflight import check_device, check_target
from nsadiag.recordspec import RecordSpec
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.rundir import prepare_run_dir, write_json, write_run_meta, write_text
from nsadiag.spec import TrialSpec
from nsadiag.traceresult import TraceResult

TIMED_STEPS = 3
TOP = 30


def trace_command(spec: TrialSpec, out_dir: Path, profiler: bool = False,
                  on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run warm-up, then alternating untraced/traced steps (and a profiled step with
    ``profiler``), telling ``on_step`` what runs; write out_dir/trace.json. A user's
    target is first imported in a watched child (require_importable)."""
    import torch

    from nsadiag.probes.trace import AutogradTracer, ProfilerSpans
    from nsadiag.targets import resolve

    require_importable(spec)
    tell = on_step or (lambda _: None)
    torch.manual_seed(spec.seed)
    target = resolve(spec)
    device = next(target.model.parameters()).device
    optimizer = torch.optim.AdamW(target.model.parameters(), lr=1e-3)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step(tracer: AutogradTracer | None) -> float:
        ids = torch.randint(target.vocab_size, (spec.batch, spec.seq_len + 1), device=device)
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16,
                            enabled=spec.dtype == "bfloat16"):
            loss = target.loss(ids)
        loss.backward()
        if tracer is not None:
            tracer.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        return time.perf_counter() - start

    tell("warm-up step")
    step(None)  # warm-up: allocator, optimizer state, lazy initialisation
    untraced: list[float] = []
    traced: list[float] = []
    tracer = AutogradTracer(target.model)
    for i in range(spec.steps):
        tell(f"step pair {i + 1} of {spec.steps} (untraced, traced)")
        untraced.append(step(None))
        tracer = AutogradTracer(target.model)
        with tracer:
            traced.append(step(tracer))

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "trace.json",
               json.dumps(tracer.chrome_trace(f"nsadiag trace: {spec.target}")))
    profiled = None
    if profiler:
        tell("profiled step (torch.profiler)")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof, \
                ProfilerSpans(target.model):
            step(None)
        profiled = out_dir / "profiler-trace.json"
        prof.export_chrome_trace(str(profiled))
    step_traced = statistics.median(traced)
    step_untraced = statistics.median(untraced)
    timeline = sorted(tracer.timeline(), key=lambda e: -e["duration_us"])[:TOP]
    return {"timeline": timeline,
            "unused_parameters": tracer.unused_parameters(),
            "repeated_gradients": tracer.repeated_gradients(),
            "unfinished_backward": tracer.unfinished_backward(),
            "step_s_traced": step_traced,
            "step_s_untraced": step_untraced,
            "step_s_traced_all": traced,
            "step_s_untraced_all": untraced,
            "overhead_pct": round(100 * (step_traced - step_untraced) / step_untraced, 2),
            "events": len(tracer.events),
            "trace_json": str(out_dir / "trace.json"),
            "profiler_trace": str(profiled) if profiled else None,
            "target": target.description}


def trace_run(spec: TrialSpec, run_dir: Path, argv: Sequence[str], profiler: bool = False,
              on_step: Callable[[str], None] | None = None,
              no_redact: bool = False) -> Rendered:
    """`nsadiag trace`: check the target and device before the run directory exists,
    trace, decide the finding once and keep it in trace-result.json (``finding``) with the
    result, render report.md and summary.json."""
    check_device(spec)
    check_target(spec)
    prepare_run_dir(run_dir)
    write_run_meta(run_dir, "trace", list(argv), spec=json.loads(spec.to_json()))
    result = trace_command(spec, run_dir, profiler, on_step)
    finding = trace_finding(TraceResult.from_dict(result),
                            RecordSpec.from_dict(json.loads(spec.to_json())))
    write_json(run_dir / "trace-result.json", {**result, "finding": finding.to_dict()})
    rendered = render_run(run_dir, no_redact)
    rendered.files += [Path(result["trace_json"])] + (
        [Path(result["profiler_trace"])] if result["profiler_trace"] else [])
    return rendered
