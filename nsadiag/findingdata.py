"""The data of a Finding: what a run found, as typed values, with no deciding code.

``Finding``, ``Culprit`` and ``Item`` (and the words their fields take: ``KINDS``,
``MARKS``, ``STATUSES``) live here, below the run directory (nsadiag.rundir), because a
trial's record holds the Finding decided when the record was made and keeps it in
record.json; nsadiag.finding decides findings and hands these names on, so
``from nsadiag.finding import Finding`` reads as before. ``to_dict`` is the JSON form
(summary.schema.json's ``$defs/finding``), ``from_dict`` reads one back whose shape that
schema has checked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nsadiag.textsafe import clean_line

KINDS = ("slow by size", "slow by defect", "slow, work not counted", "stuck", "wrong",
         "crashed", "healthy", "inconclusive", "measured")
"""What sort of finding: the first six are trouble, the last three are not. "slow, work not
counted" is a SLOW whose work was not counted (a user's own script): neither size nor
defect is known."""
MARKS = ("ok", "fail", "warn")
"""An item's mark: ok (checked and fine), fail (a failure, or implicated), warn (did not
decide: inconclusive, skipped, not applicable, cut short)."""
STATUSES = ("healthy", "failure", "inconclusive", "regression", "measured")
"""summary.json's status (nsadiag.report.summary): what the exit code stands for."""
SUMMARY_WORDS = 150


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
    # what the top block's Line says when no line is to blame, when the finding knows why
    # (a SLOW whose time is the model's own work); else the kind's own words
    line_note: str | None = None

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
        if data["line_note"] is None:  # kept out when unset: older readers see no new key
            del data["line_note"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """A stored finding. Every field is one line of a report (a title, a bullet, a
        table cell), so a line break in a received record is read as a space: a stored
        ``proof`` cannot open a second top block of its own."""
        data = _one_line(data)
        lists = {name: [Item(item["mark"], item["text"]) for item in data.get(name) or []]
                 for name in ("results", "ruled_out", "implicated")}
        culprit = Culprit.from_dict(data["culprit"]) if data.get("culprit") else None
        return cls(data["command"], data["verdict"], data["kind"], data["status"],
                   data["headline"], data["subject"], data["next_action"], culprit,
                   data.get("proof"), list(data.get("summary") or []), **lists,
                   recommendations=list(data.get("recommendations") or []),
                   chain=data.get("chain"), line_note=data.get("line_note"))


def _one_line(value: Any) -> Any:
    """A JSON value with every string in it ``clean_line``d (nsadiag.textsafe)."""
    if isinstance(value, str):
        return clean_line(value)
    if isinstance(value, dict):
        return {k: _one_line(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_one_line(v) for v in value]
    return value


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
