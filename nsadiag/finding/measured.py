"""The findings of the measurements without a verdict: memory, trace, stacks.

A measurement names no defect by itself: its finding is "MEASURED", with the number a
reader looks for first (the bytes saved for backward and the peak; the step time and the
tracer's overhead; each process's state) and where to look next. What stands out (a layer
saving far more than the others, a gradient anomaly, a process waiting where the others
do not) is named as the line or module to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nsadiag.finding import Culprit, Finding, fail, ok, warn
from nsadiag.finding.numbers import sig, size
from nsadiag.memoryrecord import MemoryRecord
from nsadiag.recordspec import RecordSpec
from nsadiag.traceresult import TraceResult


def _subject(spec: RecordSpec) -> str:
    layers = f", {spec.n_layers} layers" if spec.n_layers else ""
    return f"{spec.target or 'nsa'}{layers}, S={spec.seq_len}"


def memory_finding(measured: MemoryRecord, spec: RecordSpec) -> Finding:
    """What `nsadiag memory` measured: the saved bytes, the peak, a layer that stands out."""
    standouts = list(measured.layer_standouts)
    saved, peak = measured.saved_total, measured.peak_rss
    modules = sorted(measured.saved_by_module.items(), key=lambda kv: -kv[1])
    culprit = (Culprit(None, None, "saves more than 4x the median layer for backward",
                       module=standouts[0]) if standouts else None)
    results = [ok(f"saved for backward: {size(saved)} by the first forward"),
               ok(f"peak RSS: {size(peak)}; one step {sig(measured.step_s)} s")]
    results += [fail(f"{name} saves more than 4x the median layer") for name in standouts]
    if modules:
        results.append(ok(f"most saved by one module: {modules[0][0]} ({size(modules[0][1])})"))
    return Finding(
        command="memory", verdict="MEASURED", kind="measured", status="measured",
        headline=f"MEASURED (measured): {size(saved)} saved for backward, peak RSS {size(peak)}"
                 + (f"; {', '.join(standouts)} stand(s) out" if standouts else ""),
        subject=_subject(spec) + f", {measured.device}",
        next_action=(f"Read what {standouts[0]} keeps for backward (the largest saved "
                     f"tensors below): a layer far above the others holds a temporary or a "
                     f"cache." if standouts else
                     "To see how the peak grows, run `nsadiag sweep-seq` (against S) or "
                     "`nsadiag sweep-layers` (against depth)."),
        culprit=culprit,
        proof=f"{size(saved)} saved for backward, peak RSS {size(peak)}",
        summary=[f"The first forward saved {size(saved)} for backward on "
                 f"{measured.device}; one step takes {sig(measured.step_s)} s and "
                 f"the process peaked at {size(peak)} resident."],
        results=results)


def trace_finding(result: TraceResult, spec: RecordSpec) -> Finding:
    """What `nsadiag trace` measured: the step time, the tracer's overhead and the gradient
    anomalies (parameters without a gradient, gradients accumulated twice, a backward
    that never finished)."""
    anomalies = [(name, found) for name, found in (
        ("parameters without a gradient", result.unused_parameters),
        ("gradients accumulated more than once", result.repeated_gradients),
        ("backward started and never finished", result.unfinished_backward)) if found]
    step = result.step_s_untraced
    first = anomalies[0] if anomalies else None
    culprit = (Culprit(None, None, first[0], module=str(list(first[1])[0])) if first else None)
    results = [ok(f"one step {sig(step)} s untraced, {sig(result.step_s_traced)} s traced "
                  f"({result.overhead_pct:+.0f}%)")]
    results += [fail(f"{name}: {', '.join(map(str, list(found)[:4]))}")
                for name, found in anomalies]
    if not anomalies:
        results.append(ok("no gradient anomaly"))
    return Finding(
        command="trace", verdict="MEASURED", kind="measured", status="measured",
        headline=f"MEASURED (measured): one step {sig(step)} s, " + (
            "; ".join(name for name, _ in anomalies) if anomalies else "no gradient anomaly"),
        subject=_subject(spec),
        next_action=(f"Look at {culprit.module}: {first[0]}." if culprit else
                     "Open `trace.json` in https://ui.perfetto.dev to see where the step's "
                     "time goes."),
        culprit=culprit,
        proof=f"one step {sig(step)} s untraced ({result.overhead_pct:+.0f}% traced)",
        summary=[f"One training step takes {sig(step)} s untraced; {result.events} events "
                 f"were recorded."], results=results)


def stacks_finding(processes: list[Mapping[str, Any]], odd: list[int]) -> Finding:
    """What `nsadiag stacks` saw: each process's state, and the odd one out."""
    states = sorted({p["state"] for p in processes})
    results = [(warn if p["pid"] in odd else ok)(
        f"pid {p['pid']}" + (f" (rank {p['rank']})" if p.get("rank") is not None else "")
        + f": {p['state']}, innermost {p.get('signature') or '-'}") for p in processes]
    return Finding(
        command="stacks", verdict="MEASURED", kind="measured", status="measured",
        headline=f"MEASURED (measured): {', '.join(states)} ({len(processes)} process(es))",
        subject=", ".join(f"pid {p['pid']}" for p in processes),
        next_action=("Compare the odd process's stack with the others': it waits or works "
                     "where they do not." if odd else
                     "For a verdict over time, watch it with `nsadiag attach PID`."),
        proof=("; ".join(f"pid {p['pid']} {p['state']}" for p in processes[:4])),
        summary=[f"{len(processes)} process(es) sampled: {', '.join(states)}."],
        results=results)
