"""The report of `nsadiag memory`: what a target saves for backward, where, and the peak.

From the run directory's memory.json (the measurement, nsadiag.harness.memory): the bytes
the first forward saved for backward in all, per module, per NSA branch and per layer (a
layer saving more than four times the median stands out), the largest saved tensors,
peak RSS and step time; on CUDA the allocator's counters, the memory history's summary
and the expandable-segments A/B when it was measured. memory.png plots the per-layer and
per-branch bytes, on every device.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nsadiag.findingdata import Finding
from nsadiag.fmt import bytes_cell
from nsadiag.memoryrecord import MemoryRecord
from nsadiag.probes.gpu import GpuUnavailable
from nsadiag.recordspec import RecordSpec
from nsadiag.report.markdown import config_table, md_table
from nsadiag.report.plots import memory_plot
from nsadiag.report.skeleton import Report
from nsadiag.report.summary import Summary
from nsadiag.report.top import items
from nsadiag.runmeta import RunMeta

SUMMARY_KEYS = ("device", "saved_total", "saved_by_module", "saved_by_branch", "per_layer",
                "layer_standouts", "largest_saved", "step_s", "peak_rss", "cuda", "history",
                "gpu", "ab_expandable_segments")
TOP_MODULES = 15


def _frame(rows: list[dict[str, Any]], columns: list[str]):
    import pandas as pd

    return pd.DataFrame(rows).reindex(columns=columns)


def _history_lines(history: Mapping[str, Any]) -> list[str]:
    if "unavailable" in history:
        return [str(history["unavailable"])]
    found = history["summary"]
    sites = _frame(found["top_sites"], ["site", "bytes", "blocks"])
    sites.columns = ["allocation site (live at peak)", "bytes", "blocks"]
    return md_table(sites, {"bytes": bytes_cell, "blocks": str}) + [
        "", f"Segments {found['segments']}: reserved {bytes_cell(found['reserved'])}, allocated "
            f"{bytes_cell(found['allocated'])}, {found['free_blocks']} free blocks, largest free "
            f"block {bytes_cell(found['largest_free_block'])}, fragmentation "
            f"{found['fragmentation']:.2f}. Snapshot: `{Path(history['snapshot']).name}` "
            f"(open in https://pytorch.org/memory_viz)."]


def build_memory_report(run_dir: Path, measured: MemoryRecord, meta: RunMeta,
                        finding: Finding) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a memory run, laying out its ``finding`` (memory.json's,
    decided by nsadiag.commands.memory); writes memory.png into run_dir."""
    import pandas as pd

    spec = meta.spec or RecordSpec()
    png = memory_plot(measured, run_dir / "memory.png")
    md = items(finding.results)
    if measured.saved_by_branch:
        md += ["", "By NSA branch: " + ", ".join(
            f"{b} {bytes_cell(n)}" for b, n in measured.saved_by_branch.items()) + "."]
    report = Report.of(finding, results=md)
    report.add("Configuration", config_table(
        spec.to_dict(), ("target", "n_layers", "seq_len", "batch", "dtype", "grad_ckpt", "backend",
               "device", "steps", "overrides")))
    md = report.add("Per layer", []).body
    per_layer = _frame([r.to_dict() for r in measured.per_layer],
                       ["layer", "saved", "cuda_delta"])
    per_layer.columns = ["layer", "saved for backward", "CUDA allocated delta"]
    md += md_table(per_layer, {"saved for backward": bytes_cell,
                               "CUDA allocated delta": bytes_cell})
    if png:
        md += ["", f"![saved for backward per layer and branch]({png.name})"]
    modules = pd.DataFrame(list(measured.saved_by_module.items()), columns=["module", "saved"])
    report.add("Per module", md_table(modules, {"saved": bytes_cell}, limit=TOP_MODULES))
    largest = _frame([t.to_dict() for t in measured.largest_saved],
                     ["module", "shape", "dtype", "nbytes"])
    largest.columns = ["largest saved tensors", "shape", "dtype", "size"]
    report.add("Largest saved tensors", md_table(
        largest, {"size": bytes_cell, "shape": lambda v: str(list(v))}))
    md = report.add("Allocator", []).body
    cuda = measured.cuda
    md.append(cuda if isinstance(cuda, str) else ", ".join(f"{k} {v}" for k, v in cuda.items()))
    md += [""] + _history_lines(measured.history)
    if isinstance(measured.gpu, GpuUnavailable):
        md += ["", str(measured.gpu)]
    ab = measured.ab_expandable_segments
    if ab:
        rows = pd.DataFrame(ab["rows"])
        report.add("Expandable segments A/B", md_table(
            rows[["quantity", "baseline", "expandable", "change"]],
            {"change": lambda v: f"x{v:.2f}"}))
    report.add("Reproduction", ["```", shlex.join(meta.argv), "```"])
    stored = measured.to_dict()
    summary = Summary(command="memory", headline=finding.headline, status="measured",
                      details={"finding": finding.to_dict(),
                               **{k: stored[k] for k in SUMMARY_KEYS if k in stored}})
    return report.markdown(), summary.to_dict()
