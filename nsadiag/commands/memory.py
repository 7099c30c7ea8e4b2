"""nsadiag memory: run a few training steps of a target and report what each module, NSA
branch and layer saves for backward, the largest saved tensors, peak RSS and, on CUDA,
the allocator's counters, a recorded memory history (snapshot.pickle) and its summary.

`memory_command` measures in this process. `ab_expandable_segments` measures twice more,
each time in a fresh child process (`python -m nsadiag.commands.memory SPEC_JSON TOP`, which
prints the measurement as JSON): once with the allocator configuration of this process
minus `expandable_segments`, once with `expandable_segments:True` added. The variable is set
in the child's environment only; the allocator reads it when CUDA initialises, so it cannot
be switched inside a process that already used CUDA.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from nsadiag.probes.gpu import gpu_state
from nsadiag.probes.memory import (
    LayerDeltas,
    SavedTensorLedger,
    cuda_allocator_stats,
    per_layer,
    standouts,
)
from nsadiag.probes.snapshot import memory_history
from nsadiag.spec import TrialSpec
from nsadiag.targets import resolve, resolve_device

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
CHILD_TIMEOUT_S = 600


def memory_command(spec: TrialSpec, out_dir: Path | None = None, top: int = 10
                   ) -> dict[str, Any]:
    """spec.steps steps in this process; the first forward runs under the saved-tensor
    ledger and the per-layer deltas, every step under the CUDA memory history, saved to
    out_dir/snapshot.pickle (not recorded when out_dir is None)."""
    torch.manual_seed(spec.seed)
    target = resolve(spec)
    device = next(target.model.parameters()).device
    optimizer = torch.optim.AdamW(target.model.parameters(), lr=1e-3)
    ledger = SavedTensorLedger(target.model)
    layers = LayerDeltas(target.blocks, device)
    step_s: list[float] = []
    with contextlib.ExitStack() as stack:
        if out_dir is None and device.type == "cuda":
            history = {"unavailable": "memory history: not recorded in this measurement"}
        else:
            history = stack.enter_context(memory_history(device, out_dir))
        for step in range(spec.steps):
            ids = torch.randint(target.vocab_size, (spec.batch, spec.seq_len + 1),
                                device=device)
            _sync(device)
            start = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=spec.dtype == "bfloat16"):
                if step == 0:
                    with ledger, layers:
                        loss = target.loss(ids)
                else:
                    loss = target.loss(ids)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _sync(device)
            step_s.append(time.perf_counter() - start)
    rows = per_layer(ledger, target.blocks, layers.deltas)
    timed = step_s[1:] if len(step_s) > 1 else step_s  # step 0 pays one-off costs
    summary = {"device": device.type, "saved_total": ledger.total,
            "saved_by_module": ledger.by_module(), "saved_by_branch": ledger.by_branch(),
            "per_layer": rows, "layer_standouts": standouts(rows),
            "largest_saved": [e.to_dict() for e in ledger.largest(top)],
            "step_s": statistics.median(timed),
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "cuda": cuda_allocator_stats(device), "gpu": gpu_state(), "history": history}
    if out_dir is not None:
        (Path(out_dir) / "memory.json").write_text(json.dumps(summary, indent=1))
    return summary


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alloc_conf(current: str | None, expandable: bool) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF with expandable_segments removed, then set to True when
    `expandable`; None when nothing is left (the variable is then unset)."""
    entries = [e.strip() for e in (current or "").split(",") if e.strip()]
    kept = [e for e in entries if e.split(":", 1)[0].strip() != "expandable_segments"]
    if expandable:
        kept.append("expandable_segments:True")
    return ",".join(kept) or None


def _child_env(expandable: bool) -> dict[str, str]:
    env = dict(os.environ)
    value = alloc_conf(env.get(ALLOC_CONF), expandable)
    env.pop(ALLOC_CONF, None)
    if value is not None:
        env[ALLOC_CONF] = value
    return env


def _measure_in_child(spec: TrialSpec, top: int, expandable: bool) -> dict[str, Any]:
    try:
        done = subprocess.run([sys.executable, "-m", "nsadiag.commands.memory", spec.to_json(),
                               str(top)], capture_output=True, text=True,
                              env=_child_env(expandable), timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"ab-expandable-segments: the measuring child "
                           f"(expandable_segments={expandable}) did not finish within "
                           f"{CHILD_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"ab-expandable-segments: the measuring child "
                           f"(expandable_segments={expandable}) failed: {last}")
    return json.loads(done.stdout)


def ab_expandable_segments(spec: TrialSpec, top: int = 10) -> dict[str, Any]:
    """The measurement without and with expandable segments, each in a fresh child, and
    the comparison rows. ValueError when the spec's device is not CUDA."""
    require_cuda(spec)
    baseline = _measure_in_child(spec, top, expandable=False)
    expandable = _measure_in_child(spec, top, expandable=True)
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


def main(argv: list[str] | None = None) -> int:
    """Child entry: measure SPEC_JSON (no memory history) and print the result as JSON."""
    args = sys.argv[1:] if argv is None else argv
    try:
        spec = TrialSpec.from_json(args[0]).validate()
        summary = memory_command(spec, None, int(args[1]) if len(args) > 1 else 10)
    except (ValueError, RuntimeError, IndexError) as err:
        print(f"nsadiag.commands.memory: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
