"""nsadiag trace: one traced training step of a target in this process: a per-module
forward/backward timeline, gradient arrivals, unused and repeatedly accumulated
parameters, and a Chrome trace (trace.json, opens in Perfetto).

Overhead is measured, not guessed: after one untraced warm-up step, untraced and traced
steps alternate (TIMED_STEPS of each, same shapes, fresh ids) and the medians compare.
Each step is forward + backward + optimizer step; on CUDA the clock reads are bracketed by
torch.cuda.synchronize() (outside every hook). The report describes the last traced step.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from nsadiag.harness.targetcheck import require_importable
from nsadiag.probes.trace import AutogradTracer
from nsadiag.spec import TrialSpec
from nsadiag.targets import resolve

TIMED_STEPS = 3
TOP = 30


def trace_command(spec: TrialSpec, out_dir: Path) -> dict[str, Any]:
    """Run warm-up, then alternating untraced/traced steps; write out_dir/trace.json. A
    user's target is first imported in a watched child (require_importable)."""
    require_importable(spec)
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

    step(None)  # warm-up: allocator, optimizer state, lazy initialisation
    untraced: list[float] = []
    traced: list[float] = []
    tracer = AutogradTracer(target.model)
    for _ in range(TIMED_STEPS):
        untraced.append(step(None))
        tracer = AutogradTracer(target.model)
        with tracer:
            traced.append(step(tracer))

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "trace.json").write_text(json.dumps(tracer.chrome_trace()))
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
            "target": target.description}
