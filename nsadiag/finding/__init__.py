"""What a run found, typed: one ``Finding`` for every run kind, decided before any report.

A finding answers what a reader asks first, in this order:

    verdict       OK, SLOW, STALL-BUSY, STALL-COLLECTIVE, DEADLOCK, OOM, ERROR, CRASH, WRONG,
                  INCONCLUSIVE, or MEASURED for a measurement without a verdict
    kind          what sort of trouble (``KINDS``): slow by size, slow by defect, stuck,
                  wrong, crashed; healthy, inconclusive or measured otherwise
    culprit       the one user line responsible (``Culprit``: FILE:LINE, the code, why that
                  line), the defect's line rather than the hottest healthy one; None when
                  nothing failed or the evidence names no line
    proof         the one number that proves it, as a sentence
    next_action   one concrete sentence: the fix, or the next command

then a summary (sentences, ``SUMMARY_WORDS`` words at most), one-line results marked
ok/fail/warn (``Item``), what is ruled out and what is implicated, and recommendations.
Each command builds its finding where its result is assembled (``nsadiag.finding.trial``
for one trial, ``.sweep``, ``.check``, ``.attach``, ``.measured``, and
``nsadiag.triage.finding``); ``nsadiag.report`` only lays it out. summary.json carries it
as ``finding`` (``to_dict``), and ``from_dict`` reads it back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("slow by size", "slow by defect", "slow, work not counted", "stuck", "wrong",
         "crashed", "healthy", "inconclusive", "measured")
"""What sort of finding: the first six are trouble, the last three are not. "slow, work not
counted" is a SLOW whose work was not counted (a user's own script): neither size nor
defect is known."""
STUCK = frozenset({"STALL-BUSY", "STALL-COLLECTIVE", "DEADLOCK"})
CRASHED = frozenset({"OOM", "ERROR", "CRASH"})
MARKS = ("ok", "fail", "warn")
"""An item's mark: ok (checked and fine), fail (a failure, or implicated), warn (did not
decide: inconclusive, skipped, not applicable, cut short)."""
STATUSES = ("healthy", "failure", "inconclusive", "regression", "measured")
"""summary.json's status (nsadiag.report.summary): what the exit code stands for."""
SUMMARY_WORDS = 150


def kind_of(verdict: str, slow_by: str | None = None) -> str:
    """The kind of a verdict: SLOW by its ``slow_by`` fact ("size", "defect", or None when
    the work was not counted), stalls and deadlocks stuck, OOM/ERROR/CRASH crashed, WRONG
    wrong, OK healthy, INCONCLUSIVE inconclusive, MEASURED measured."""
    if verdict == "SLOW":
        return {"defect": "slow by defect", "size": "slow by size"}.get(
            slow_by or "", "slow, work not counted")
    if verdict in STUCK:
        return "stuck"
    if verdict in CRASHED:
        return "crashed"
    return {"WRONG": "wrong", "OK": "healthy", "INCONCLUSIVE": "inconclusive",
            "MEASURED": "measured"}.get(verdict, "inconclusive")


@dataclass(frozen=True)
class Culprit:
    """The user line a finding blames.

    file       the file as shown: its path from the top of its package
               ("repro/per_token_loop.py"), a script's name otherwise
    line       the line the evidence points at (a loop's header, the line waiting)
    end_line   the statement's last line when it spans several (a loop's body), else None
    code       the source of ``line`` (stripped), None when it could not be read
    why        what the evidence says about it: "the loop over `t` ran 2,143 times"
    module     the module (e.g. "blocks.0") when a check names a module and no line
    host_read  a loop's first line that reads a tensor's value on the host (``.item()``,
               ``.tolist()``, ``.cpu()``, ``.numpy()``) in its body, as "25 `x.item()`";
               None when the body has none or is not a loop
    retains    the container a loop keeps appending tensors to ("history"), when memory
               grew per step and this line is what keeps it; None otherwise
    """

    file: str | None
    line: int | None
    why: str
    end_line: int | None = None
    code: str | None = None
    module: str | None = None
    host_read: str | None = None
    retains: str | None = None

    def where(self) -> str:
        """FILE:LINE or FILE:FIRST-LAST; the module when there is no line."""
        if self.file is None or self.line is None:
            return self.module or "-"
        if self.end_line and self.end_line > self.line:
            return f"{self.file}:{self.line}-{self.end_line}"
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "where": self.where()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Culprit:
        return cls(data["file"], data["line"], data["why"], data.get("end_line"),
                   data.get("code"), data.get("module"), data.get("host_read"),
                   data.get("retains"))


@dataclass(frozen=True)
class Item:
    """One finding of a list, one line: ``mark`` (MARKS) and the text."""

    mark: str
    text: str

    def __post_init__(self) -> None:
        if self.mark not in MARKS:
            raise ValueError(f"mark: must be one of {', '.join(MARKS)}, got {self.mark!r}")


def ok(text: str) -> Item:
    return Item("ok", text)


def fail(text: str) -> Item:
    return Item("fail", text)


def warn(text: str) -> Item:
    return Item("warn", text)


@dataclass
class Finding:
    """What one run found (see the module docstring). ``subject`` says what ran ("nsa, 4
    layers, S=2048"); ``headline`` is the one line a terminal prints; ``status`` is
    summary.json's (STATUSES); ``results`` the systematic results, one item each;
    ``chain`` a stuck run's wait chain as printed (nsadiag.verdict.chain), None otherwise."""

    command: str
    verdict: str
    kind: str
    status: str
    headline: str
    subject: str
    next_action: str
    culprit: Culprit | None = None
    proof: str | None = None
    summary: list[str] = field(default_factory=list)
    results: list[Item] = field(default_factory=list)
    ruled_out: list[Item] = field(default_factory=list)
    implicated: list[Item] = field(default_factory=list)
    recommendations: list[str] = field(default_factory=list)
    chain: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind: must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.status not in STATUSES:
            raise ValueError(f"status: must be one of {', '.join(STATUSES)}, got "
                             f"{self.status!r}")
        self.summary = fit_words(self.summary)

    @property
    def trouble(self) -> bool:
        """Whether the kind is trouble (slow, stuck, wrong or crashed)."""
        return self.kind in KINDS[:6]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["culprit"] = self.culprit.to_dict() if self.culprit else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        lists = {name: [Item(**item) for item in data.get(name) or []]
                 for name in ("results", "ruled_out", "implicated")}
        culprit = Culprit.from_dict(data["culprit"]) if data.get("culprit") else None
        return cls(data["command"], data["verdict"], data["kind"], data["status"],
                   data["headline"], data["subject"], data["next_action"], culprit,
                   data.get("proof"), list(data.get("summary") or []), **lists,
                   recommendations=list(data.get("recommendations") or []),
                   chain=data.get("chain"))


def words(text: str) -> int:
    return len(text.split())


def fit_words(sentences: list[str], limit: int = SUMMARY_WORDS) -> list[str]:
    """The leading sentences that fit in ``limit`` words together (the first is kept
    whole if it alone is longer: cut at the limit, with an ellipsis)."""
    kept: list[str] = []
    total = 0
    for sentence in sentences:
        count = words(sentence)
        if total + count > limit:
            if not kept:
                kept.append(" ".join(sentence.split()[:limit - 1]) + " …")
            break
        kept.append(sentence)
        total += count
    return kept
