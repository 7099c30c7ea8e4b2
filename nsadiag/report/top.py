"""The top of every report, one layout for every run kind: what a reader needs in 30 s.

``top_block(finding)`` is the title and four lines before anything else:

    # nsadiag triage: ❌ SLOW (slow by defect) at repro/per_token_loop.py:26-30
    - **Run:** repro.per_token_loop:make, 1 layer, S=256
    - **Line:** `repro/per_token_loop.py:26-30` `for t in range(...):` — the loop over `t` ...
    - **Proof:** 256 host reads (`.item()`, `.tolist()`) per step for 256 tokens: one per token
    - **Next:** Replace the per-token Python loop at ... ; then run the same command again.

with, for a stuck run, its wait chain after the line (``- **Waits:** the main thread waits
for `stats_lock` at train.py:51 -> `stats_lock` is held by thread logger ...``),

then ``summary_text`` (the finding's summary, at most 150 words), and the bullet lists
every report shares: ``items`` (✅ ok, ❌ fail, ⚠ warn, one line each) and
``cause_section`` (ruled out, implicated). Everything here lays out a
``nsadiag.finding.Finding``; nothing is decided. The order of the parts is
nsadiag.report.skeleton's.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsadiag.finding import Finding, Item
from nsadiag.textsafe import clean_line

SYMBOLS = {"ok": "✅", "fail": "❌", "warn": "⚠"}
STATUS_SYMBOL = {"failure": "❌", "inconclusive": "⚠", "regression": "⚠", "healthy": "✅",
                 "measured": "✅"}
NO_LINE = {"healthy": "none: nothing failed", "slow by size": "none: no defect was counted; "
           "the time goes into the model's own work", "inconclusive": "none: nothing was "
           "decided", "measured": "none: a measurement, not a verdict"}


def title(finding: Finding) -> str:
    """The report's first line: the status's mark and the headline, which names the
    verdict first (a stored headline that does not is put after the verdict's name)."""
    headline = finding.headline if finding.headline.startswith(finding.verdict) else \
        f"{finding.verdict}: {finding.headline}"
    return f"# nsadiag {finding.command}: {STATUS_SYMBOL[finding.status]} {headline}"


def line_text(finding: Finding) -> str:
    """The culprit line as the top block shows it."""
    culprit = finding.culprit
    if culprit is None:
        return finding.line_note or NO_LINE.get(finding.kind,
                                                "not named by the evidence (see Evidence)")
    code = f" `{culprit.code}`" if culprit.code else ""
    return f"`{culprit.where()}`{code} — {culprit.why}"


def top_block(finding: Finding) -> list[str]:
    """The title and four lines: what ran, the line, the proof, the next step; a stuck
    run's wait chain (who waits for whom, each at its line) after the line. Each is one
    line whatever its text holds (an exception message with a line break cannot start a
    heading or a second block)."""
    chain = [f"- **Waits:** {finding.chain}"] if finding.chain else []
    return [clean_line(line) for line in (
        title(finding),
        f"- **Run:** {finding.subject}",
        f"- **Line:** {line_text(finding)}",
        *chain,
        f"- **Proof:** {finding.proof or 'no single number: see the results below'}",
        f"- **Next:** {finding.next_action}")]


def summary_text(finding: Finding) -> str:
    """The finding's summary as one paragraph (its headline when it has none)."""
    return " ".join(finding.summary) or finding.headline + "."


def items(found: Sequence[Item], empty: str = "nothing") -> list[str]:
    """One bullet per item, marked ✅, ❌ or ⚠."""
    if not found:
        return [f"- {empty}"]
    return [clean_line(f"- {SYMBOLS[item.mark]} {item.text}") for item in found]


def cause_section(finding: Finding) -> list[str]:
    """What is ruled out (✅) and what is implicated (❌), one line each."""
    return (["Ruled out:", ""] + items(finding.ruled_out, "nothing yet") +
            ["", "Implicated:", ""] + items(finding.implicated, "nothing: no failure"))



def recommendations(finding: Finding) -> list[str]:
    """The next step first, then the finding's further recommendations, numbered."""
    steps = [finding.next_action, *[r for r in finding.recommendations
                                    if r != finding.next_action]]
    return [f"{i}. {step}" for i, step in enumerate(steps, 1)]
