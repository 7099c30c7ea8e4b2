"""The finding of `nsadiag check` (and of a triage's checks stage): which check failed, the
module it names, the difference against the reference that proves it.

A check that ran out of time (its child still progressing at the budget: SLOW, or a timing
that load explains: INCONCLUSIVE) decided nothing: it is INCONCLUSIVE for that check, never
a failure, and names no module. Every other check that did not pass (WRONG, ERROR, CRASH,
OOM, a stall) is a failure; NOT APPLICABLE is neither.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsadiag.checks import CheckResult
from nsadiag.finding import Culprit, Finding, Item, fail, ok, warn
from nsadiag.finding.known_fixes import fixes_for
from nsadiag.recordspec import RecordSpec
from nsadiag.verdict import explain_exception
from nsadiag.verdict.triage import CHECK_TIMED_OUT

ADVICE = {
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
"""What to do after a WRONG, by check."""
NAMED = {"causality": "the first block whose output before position t moved",
         "parity": "the first layer that differs from the naive oracle",
         "ckpt": "the first module whose recompute differs from its forward",
         "ddp": "the first module whose DDP gradients differ from one process's"}
"""What the module a failed check names is."""


def timed_out(result: CheckResult) -> bool:
    """Whether a check ran out of time (see the module docstring)."""
    return result.verdict.name in CHECK_TIMED_OUT


def failed(result: CheckResult) -> bool:
    """A check that found a failure: not passed and not out of time."""
    return result.failed


def check_item(result: CheckResult) -> Item:
    """One line per check: ✅ passed, ⚠ not applicable or out of time, ❌ failed."""
    if timed_out(result):
        return warn(f"{result.name}: INCONCLUSIVE: did not finish within its time budget "
                    f"({result.verdict.name}); a larger --budget lets it decide")
    if not result.applicable:
        return warn(f"{result.name}: {result.summary}")
    if result.passed:
        return ok(f"{result.name}: {result.summary}")
    where = f" in {result.module}" if result.module else ""
    return fail(f"{result.name}: {result.verdict.name}{where}: {result.summary}")


def known_causes(result: CheckResult) -> list[str]:
    """The cause and fixes of a known exception in the check's reasons."""
    explained = explain_exception("", " ".join(result.verdict.reasons))
    if explained is None:
        return []
    return [f"Cause: {explained['cause']}."] + [f"Fix: {fix}." for fix in
                                                 fixes_for(explained["known"])]


def check_next(result: CheckResult) -> str:
    """What to do after a failed check."""
    if result.verdict.name == "WRONG":
        return ADVICE[result.name]
    fixes = known_causes(result)
    if fixes:
        return " ".join(fixes)
    return (f"The {result.name} check itself ended {result.verdict.name}: run `nsadiag "
            f"sweep-layers` on the same target to see where a trial stops.")


def check_culprit(result: CheckResult) -> Culprit | None:
    """The module a failed check names (checks name modules, not lines); None for a check
    that passed or ran out of time."""
    if not failed(result) or not result.module:
        return None
    why = NAMED.get(result.name, "the module the check names") if \
        result.verdict.name == "WRONG" else f"where the {result.name} check stopped"
    return Culprit(None, None, why, module=result.module)


def check_finding(results: Sequence[CheckResult], spec: RecordSpec,
                  rerun: str | None = None) -> Finding:
    """The finding of the checks run on ``spec`` (checks.json's TrialSpec)."""
    bad = [r for r in results if failed(r)]
    unsure = [r for r in results if timed_out(r)]
    subject = f"{spec.target}, S={spec.seq_len}"
    items = [check_item(r) for r in results]
    if bad:
        first = bad[0]
        kind = "wrong" if first.verdict.name == "WRONG" else \
            "stuck" if first.verdict.name.startswith("STALL") or \
            first.verdict.name == "DEADLOCK" else "crashed"
        where = f" in {first.module}" if first.module else ""
        action = check_next(first) + (f" Then check again: `{rerun}`." if rerun else "")
        return Finding(
            command="check", verdict=first.verdict.name, kind=kind, status="failure",
            headline=f"{first.verdict.name} ({kind}): the {first.name} check{where}",
            subject=subject, next_action=action, culprit=check_culprit(first),
            proof=first.summary,
            summary=[f"{len(bad)} of {len(results)} check(s) failed; the first is "
                     f"{first.name}{where}: {first.summary}."],
            results=items, ruled_out=[i for i in items if i.mark == "ok"],
            implicated=[i for i in items if i.mark == "fail"])
    passed = [r for r in results if r.passed and r.applicable]
    if unsure:
        names = ", ".join(r.name for r in unsure)
        return Finding(
            command="check", verdict="INCONCLUSIVE", kind="inconclusive",
            status="inconclusive",
            headline=f"INCONCLUSIVE (inconclusive): {names} did not finish in time",
            subject=subject, next_action=f"Run {names} again with a larger --budget (each "
            f"ran out of its {spec.budget_s or 0:g} s).",
            proof=f"{len(passed)} of {len(results)} check(s) passed, {len(unsure)} ran out "
                  f"of time",
            summary=[f"{len(unsure)} check(s) ran out of time and decided nothing: {names}; "
                     f"the others passed or do not apply."], results=items,
            ruled_out=[i for i in items if i.mark == "ok"])
    skipped = len(results) - len(passed)
    ran = f"{len(passed)} check(s) passed" + (f", {skipped} not applicable" if skipped else "")
    return Finding(command="check", verdict="OK", kind="healthy", status="healthy",
                   headline=f"OK (healthy): {ran}", subject=subject,
                   next_action="Nothing to fix: every check that applies passed on this "
                               "configuration.",
                   proof="; ".join(r.summary for r in passed[:1]) or None,
                   summary=[f"{ran}."], results=items,
                   ruled_out=[i for i in items if i.mark == "ok"])
