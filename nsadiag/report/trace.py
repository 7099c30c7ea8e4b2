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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nsadiag.report.markdown import config_table, md_table
from nsadiag.report.summary import Summary

SUMMARY_KEYS = ("step_s_traced", "step_s_untraced", "step_s_traced_all",
                "step_s_untraced_all", "overhead_pct", "events", "unused_parameters",
                "repeated_gradients", "unfinished_backward", "timeline", "trace_json",
                "profiler_trace", "target")
SHOWN = 15


def build_trace_report(run_dir: Path, result: Mapping[str, Any], meta: Mapping[str, Any]
                       ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a trace run."""
    import pandas as pd

    spec = meta.get("spec") or {}
    anomalies = [name for name, found in (("unused parameters", result["unused_parameters"]),
                                          ("repeated gradients", result["repeated_gradients"]),
                                          ("unfinished backward",
                                           result["unfinished_backward"])) if found]
    headline = (f"one step {result['step_s_untraced']:.3f} s, "
                f"{'; '.join(anomalies) if anomalies else 'no gradient anomaly'}")
    md = [f"# nsadiag trace: {headline}", "", "## Executive summary", "",
          f"One training step of `{result.get('target') or spec.get('target')}` takes "
          f"{result['step_s_untraced']:.3f} s untraced and {result['step_s_traced']:.3f} s "
          f"traced ({result['overhead_pct']:+.1f}%, medians); {result['events']} events were "
          f"recorded. Timeline: `{Path(result['trace_json']).name}` (Perfetto)."]
    if result.get("profiler_trace"):
        md += ["", f"torch.profiler trace with the same module and branch spans: "
                   f"`{Path(result['profiler_trace']).name}`."]
    md += ["", "## Configuration", ""] + config_table(
        spec, ("target", "n_layers", "seq_len", "batch", "dtype", "grad_ckpt", "backend",
               "device", "overrides"))
    spans = pd.DataFrame(result["timeline"]).reindex(
        columns=["module", "phase", "start_us", "duration_us"])
    spans["start_us"] = spans["start_us"] / 1000
    spans["duration_us"] = spans["duration_us"] / 1000
    spans.columns = ["module", "phase", "start ms", "duration ms"]
    md += ["", f"## Longest spans (of {len(spans)} kept)", ""] + md_table(
        spans, {"start ms": lambda v: f"{v:.1f}", "duration ms": lambda v: f"{v:.1f}"},
        limit=SHOWN)
    md += ["", "## Gradients", ""]
    md.append("- Parameters without a gradient: " + (
        ", ".join(f"`{p}`" for p in result["unused_parameters"]) or "none"))
    md.append("- Gradients accumulated more than once in a step: " + (
        ", ".join(f"`{p}` ({n}x)" for p, n in result["repeated_gradients"].items()) or "none"))
    md.append("- Backward started and never finished: " + (
        ", ".join(f"`{m}`" for m in result["unfinished_backward"]) or "none"))
    md += ["", "## Reproduction", "", "```", shlex.join(meta.get("argv") or []), "```"]
    summary = Summary(command="trace", headline=headline, status="measured",
                      details={k: result.get(k) for k in SUMMARY_KEYS})
    return "\n".join(md) + "\n", summary.to_dict()
