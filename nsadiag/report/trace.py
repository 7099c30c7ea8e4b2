"""The report of `nsadiag trace`: one traced training step, module by module.

From the run directory's trace-result.json (nsadiag.commands.trace): the longest forward
and backward spans, parameters without a gradient, gradients accumulated more than once
in a step, backward passes that started and never ended, and the measured overhead of the
tracing. The timeline itself is trace.json (Chrome trace events: Perfetto, chrome://tracing);
with --profiler, profiler-trace.json holds torch.profiler's operators with the same module
and branch spans.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from nsadiag.findingdata import Finding
from nsadiag.recordspec import RecordSpec
from nsadiag.report.markdown import config_table, md_table
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary
from nsadiag.report.top import items
from nsadiag.runmeta import RunMeta
from nsadiag.traceresult import TraceResult

SUMMARY_KEYS = ("step_s_traced", "step_s_untraced", "step_s_traced_all",
                "step_s_untraced_all", "overhead_pct", "events", "unused_parameters",
                "repeated_gradients", "unfinished_backward", "timeline", "trace_json",
                "profiler_trace", "target")
SHOWN = 15


def build_trace_report(run_dir: Path, result: TraceResult, meta: RunMeta, finding: Finding
                       ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a trace run, laying out its ``finding``
    (trace-result.json's, decided by nsadiag.commands.trace)."""
    import pandas as pd

    spec = meta.spec or RecordSpec()
    md = items(finding.results)
    md += ["", f"Untraced and traced step medians: {result.step_s_untraced:.3f} s and "
               f"{result.step_s_traced:.3f} s. Timeline: `{Path(result.trace_json).name}` "
               f"(Perfetto)."]
    if result.profiler_trace:
        md += ["", f"torch.profiler trace with the same module and branch spans: "
                   f"`{Path(result.profiler_trace).name}`."]
    report = Report.of(finding, results=md)
    report.add("Configuration", config_table(
        spec.to_dict(), ("target", "n_layers", "seq_len", "batch", "dtype", "grad_ckpt", "backend",
               "device", "overrides")))
    spans = pd.DataFrame(list(result.timeline)).reindex(
        columns=["module", "phase", "start_us", "duration_us"])
    spans["start_us"] = spans["start_us"] / 1000
    spans["duration_us"] = spans["duration_us"] / 1000
    spans.columns = ["module", "phase", "start ms", "duration ms"]
    report.add(f"Longest spans (of {len(spans)} kept)", md_table(
        spans, {"start ms": lambda v: f"{v:.1f}", "duration ms": lambda v: f"{v:.1f}"},
        limit=SHOWN))
    md = report.add("Gradients", []).body
    md.append("- Parameters without a gradient: " + (
        ", ".join(f"`{p}`" for p in result.unused_parameters) or "none"))
    md.append("- Gradients accumulated more than once in a step: " + (
        ", ".join(f"`{p}` ({n}x)" for p, n in result.repeated_gradients.items()) or "none"))
    md.append("- Backward started and never finished: " + (
        ", ".join(f"`{m}`" for m in result.unfinished_backward) or "none"))
    report.add("Reproduction", ["```", shlex.join(meta.argv), "```"])
    stored = result.to_dict()
    summary = Summary(command="trace", headline=finding.headline, status="measured",
                      details={"finding": finding.to_dict(),
                               **{k: stored[k] for k in SUMMARY_KEYS}})
    return report.markdown(), summary.to_dict()
