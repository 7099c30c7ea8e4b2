"""nsadiag check: run correctness checks on a target and write report.md + summary.json.

The run directory holds spec.json, one folder per check (the child's events, result and
check.json), report.md and summary.json. The report has the shape of the other reports
(summary, configuration, results, evidence, reproduction, recommendations); every sentence
in it comes from a check's measured numbers. Host names, IPs and user names are redacted
unless asked not to.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nsadiag.checks import CheckResult, run_checks
from nsadiag.commands.sweep import check_target
from nsadiag.report import redact
from nsadiag.rundir import prepare_run_dir
from nsadiag.spec import TrialSpec
from nsadiag.verdict import explain_exception

RECOMMENDATIONS = {
    "causality": "A position reads the future: look at the named block for shifts, padding "
                 "or masks that let position t see t+1 (and at scoring that uses unmasked "
                 "keys).",
    "parity": "A backend disagrees with the naive oracle: rerun the named layer with that "
              "backend and the oracle at the smallest shape that fails, branch by branch.",
    "ckpt": "Checkpoint recomputation does not repeat the forward: bind the block when the "
            "checkpointed function is made (checkpoint(blk, x) or a default argument "
            "`lambda t, blk=blk: blk(t)`), and make every recomputed choice deterministic.",
    "ddp": "DDP disagrees with one process: look for rank-dependent control flow, buffers "
           "updated in forward, or parameters used outside DDP's forward.",
}
def check_command(names: Sequence[str], spec: TrialSpec, run_dir: Path, argv: Sequence[str],
                  world_size: int = 2, no_redact: bool = False) -> tuple[list[CheckResult], Path]:
    """Run the checks (see nsadiag.checks.run_checks); returns them and report.md's path."""
    check_target(spec)
    prepare_run_dir(run_dir)
    (run_dir / "spec.json").write_text(spec.to_json())
    results = run_checks(names, spec.replace(out_dir=str(run_dir)), run_dir, world_size)
    text, summary = build_check_report(results, spec, argv, world_size)
    if not no_redact:
        text, summary = redact(text), json.loads(redact(json.dumps(summary)))
    (run_dir / "report.md").write_text(text)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return results, run_dir / "report.md"


def layers_run(results: Sequence[CheckResult], asked: int | None) -> str:
    """The blocks the checks' models had: what was asked, or the factory's default."""
    seen = sorted({r.verdict.facts.get("layers") for r in results} - {None})
    if asked is not None or not seen:
        return str(asked) if asked is not None else "unknown (no block was watched)"
    return f"{', '.join(map(str, seen))} (the factory's default)"


def headline(results: Sequence[CheckResult]) -> str:
    failed = [r for r in results if not r.passed]
    if not failed:
        skipped = sum(not r.applicable for r in results)
        ran = f"{len(results) - skipped} check(s) passed"
        return f"{ran}, {skipped} not applicable" if skipped else ran
    first = failed[0]
    where = f" at {first.module}" if first.module else ""
    return f"{first.name} {first.verdict.name}{where}"


def build_check_report(results: Sequence[CheckResult], spec: TrialSpec, argv: Sequence[str],
                       world_size: int) -> tuple[str, dict[str, Any]]:
    title = headline(results)
    failed = [r for r in results if not r.passed]
    md = [f"# nsadiag check: {title}", "", "## Executive summary", ""]
    if failed:
        md += [f"{len(failed)} of {len(results)} check(s) failed. The first: **{failed[0].name}"
               f" {failed[0].verdict.name}**" + (f" at `{failed[0].module}`" if failed[0].module
                                                else "") + f": {failed[0].summary}."]
    else:
        md += [f"All {len(results)} check(s) passed."]
    md += ["", "## Configuration", "", "| field | value |", "|---|---|"]
    for key in ("target", "n_layers", "seq_len", "batch", "dtype", "backend", "device", "seed",
                "stall_timeout_s", "budget_s", "overrides"):
        value = getattr(spec, key)
        if key == "n_layers":
            value = layers_run(results, value)
        md.append(f"| {key} | {value} |")
    md.append(f"| ddp world size | {world_size} |")
    md += ["", "## Results", "", "| check | verdict | module | summary |", "|---|---|---|---|"]
    for r in results:
        md.append(f"| {r.name} | {r.status} | {r.module or '-'} | {r.summary} |")
    md += ["", "## Evidence"]
    for r in results:
        md += ["", f"### {r.name}: {r.status}", ""] + table_lines(r.table)
        md += [f"- {note}" for note in known_causes(r)]
    md += ["", "## Minimal reproduction", "", "```", shlex.join(argv), "```"]
    md += ["", "## Recommendations", ""]
    md += [f"- {r.name}: {RECOMMENDATIONS[r.name]}" for r in failed if r.verdict.name == "WRONG"]
    md += [f"- {r.name}: the check did not finish ({r.verdict.name}); run `nsadiag "
           f"sweep-layers` or `nsadiag trace` on the same target to see where it stops."
           for r in failed if r.verdict.name != "WRONG"]
    if not failed:
        md.append("Nothing to fix: every check passed on this configuration.")
    summary = {"command": "check", "headline": title, "passed": not failed,
               "checks": [r.to_dict() for r in results]}
    return "\n".join(md) + "\n", summary


def known_causes(result: CheckResult) -> list[str]:
    """The cause and fixes of a known exception in the check's reasons (verdict.py's table)."""
    explained = explain_exception("", " ".join(result.verdict.reasons))
    if explained is None:
        return []
    return [f"Cause: {explained['cause']}."] + [f"Fix: {fix}." for fix in explained["fixes"]]


def table_lines(rows: Sequence[dict[str, Any]], limit: int = 40) -> list[str]:
    """A Markdown table of dict rows (the keys of the first row are the columns)."""
    if not rows:
        return ["No table."]
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows[:limit]:
        lines.append("| " + " | ".join(_cell(row.get(k)) for k in keys) + " |")
    if len(rows) > limit:
        lines.append(f"\n({len(rows) - limit} more rows in summary.json)")
    return lines


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if value is None:
        return "-"
    return str(value).replace("|", "\\|")
