"""The skeleton every report.md shares, laid out in one place.

A ``Report`` is the top block (nsadiag.report.top: the title and the four lines), then its
sections in order, each a ``Section``: a level-2 heading and the lines of its body. A
report of a finding (``Report.of``) opens with the Summary and the Results; the renderers
add their own sections after them, and the run directory's trailing sections (records
skipped, files not read: nsadiag.report.dispatch) are sections too. ``markdown()`` is the
one place the blank lines between the parts are written: one before every heading, one
after it when a body follows, and a newline at the end of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from nsadiag.finding import Finding
from nsadiag.report.top import items, summary_text, top_block


@dataclass
class Section:
    """One ``## heading`` and the lines under it (which may hold ``###`` subheadings)."""

    heading: str
    body: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return ["", f"## {self.heading}", *([""] if self.body else []), *self.body]

    def markdown(self) -> str:
        """The section alone, as text that follows a report's final newline."""
        return "\n".join(self.lines()) + "\n"


@dataclass
class Report:
    """The top block's lines and the sections after it."""

    top: list[str]
    sections: list[Section] = field(default_factory=list)

    @classmethod
    def of(cls, finding: Finding, results: Sequence[str] | None = None,
           summary_note: Sequence[str] = ()) -> Report:
        """A finding's report as every kind begins it: the top block, the Summary (with
        ``summary_note``'s lines after it, a blank line between), and the Results
        (``results``, the finding's items when not given)."""
        summary = [summary_text(finding), *(line for note in summary_note
                                            for line in ("", note))]
        shown = items(finding.results) if results is None else list(results)
        return cls(top_block(finding), [Section("Summary", summary),
                                        Section("Results", shown)])

    def add(self, heading: str, body: Sequence[str]) -> Section:
        """Append a section and give it back, for a body built in steps."""
        section = Section(heading, list(body))
        self.sections.append(section)
        return section

    def markdown(self) -> str:
        lines = list(self.top)
        for section in self.sections:
            lines += section.lines()
        return "\n".join(lines) + "\n"
