"""The report of `nsadiag check`: correctness checks on a target.

The shape of the other reports (summary, configuration, results, evidence, reproduction,
recommendations); every sentence comes from a check's measured numbers. The checks are the
run directory's checks.json (``CheckResult.to_dict()`` each, written by
nsadiag.commands.check), the configuration its spec.json, the command its run.json.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from nsadiag.checks import CheckResult
from nsadiag.report.markdown import config_table, dict_table
from nsadiag.report.summary import Summary, verdict_row
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


def layers_run(results: Sequence[CheckResult], asked: int | None) -> str:
    """The blocks the checks' models had: what was asked, or the factory's default."""
    seen = sorted({r.verdict.facts.get("layers") for r in results} - {None})
    if asked is not None or not seen:
        return str(asked) if asked is not None else "unknown (no block was watched)"
    return f"{', '.join(map(str, seen))} (the factory's default)"


def headline(results: Sequence[CheckResult]) -> str:
    """"N check(s) passed[, M not applicable][, K inconclusive]", or the first failed
    check and its module."""
    failed = [r for r in results if r.failed]
    if not failed:
        skipped = sum(not r.applicable for r in results)
        undecided = sum(not r.passed for r in results)
        ran = f"{len(results) - skipped - undecided} check(s) passed"
        ran += f", {skipped} not applicable" if skipped else ""
        return ran + (f", {undecided} inconclusive (out of time)" if undecided else "")
    first = failed[0]
    where = f" at {first.module}" if first.module else ""
    return f"{first.name} {first.verdict.name}{where}"


def known_causes(result: CheckResult) -> list[str]:
    """The cause and fixes of a known exception in the check's reasons (verdict.py's table)."""
    explained = explain_exception("", " ".join(result.verdict.reasons))
    if explained is None:
        return []
    return [f"Cause: {explained['cause']}."] + [f"Fix: {fix}." for fix in explained["fixes"]]


def build_check_report(results: Sequence[CheckResult], spec: Mapping[str, Any],
                       argv: Sequence[str], world_size: int) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of the checks run on ``spec`` (a TrialSpec's JSON form)."""
    title = headline(results)
    failed = [r for r in results if r.failed]
    undecided = [r for r in results if not r.passed and not r.failed]
    md = [f"# nsadiag check: {title}", "", "## Executive summary", ""]
    if failed:
        md += [f"{len(failed)} of {len(results)} check(s) failed. The first: **{failed[0].name}"
               f" {failed[0].verdict.name}**" + (f" at `{failed[0].module}`" if failed[0].module
                                                else "") + f": {failed[0].summary}."]
    elif undecided:
        md += [f"{len(undecided)} of {len(results)} check(s) inconclusive: "
               + "; ".join(r.summary for r in undecided) + "."]
    else:
        md += [f"All {len(results)} check(s) passed."]
    shown = {**spec, "n_layers": layers_run(results, spec.get("n_layers"))}
    md += ["", "## Configuration", ""] + config_table(
        shown, ("target", "n_layers", "seq_len", "batch", "dtype", "backend", "device", "seed",
                "stall_timeout_s", "budget_s", "overrides"), [("ddp world size", world_size)])
    md += ["", "## Results", "", "| check | verdict | module | summary |", "|---|---|---|---|"]
    for r in results:
        md.append(f"| {r.name} | {r.status} | {r.module or '-'} | {r.summary} |")
    md += ["", "## Evidence"]
    for r in results:
        md += ["", f"### {r.name}: {r.status}", ""] + dict_table(r.table)
        md += [f"- {note}" for note in known_causes(r)]
    md += ["", "## Minimal reproduction", "", "```", shlex.join(argv), "```"]
    md += ["", "## Recommendations", ""]
    md += [f"- {r.name}: {RECOMMENDATIONS[r.name]}" for r in failed if r.verdict.name == "WRONG"]
    md += [f"- {r.name}: the check did not finish ({r.verdict.name}); run `nsadiag "
           f"sweep-layers` or `nsadiag trace` on the same target to see where it stops."
           for r in failed if r.verdict.name != "WRONG"]
    md += [f"- {r.name}: nothing was decided: rerun with a larger --budget, or on a quieter "
           f"machine." for r in undecided]
    if not failed and not undecided:
        md.append("Nothing to fix: every check passed on this configuration.")
    summary = Summary(
        command="check", headline=title,
        status="failure" if failed else "inconclusive" if undecided else "healthy",
        verdicts=[verdict_row(r.name, r.status, spec.get("n_layers"), spec.get("seq_len"))
                  for r in results],
        failing=failed[0].verdict.to_dict() if failed else None,
        details={"passed": not failed, "checks": [r.to_dict() for r in results]})
    return "\n".join(md) + "\n", summary.to_dict()
