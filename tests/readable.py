"""What a rendered report must give a reader in 30 seconds (checked on the demo, a slow by
defect target, a deadlock, a healthy triage and a DDP stall): the first five lines name the
verdict, its kind and the defect's FILE:LINE; the summary is at most 150 words; no table
cell reads None; a healthy line never appears as the cause."""

import re

from nsadiag.finding import Finding

HEALTHY = ("_base.py:17", "_base.py:32")
"""repro/_base.py's ResidualMLP and TinyLM lines: healthy code every zoo entry runs."""


def section(text: str, heading: str) -> str:
    """The body of a ``## heading`` section ("" when there is none)."""
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    found = [p for p in parts if p.startswith(heading + "\n")]
    return found[0][len(heading) + 1:] if found else ""


def assert_readable(text: str, finding: Finding, where: str | None) -> None:
    """The checks of the module docstring; ``where`` is the defect's FILE:LINE (None for
    a finding with no culprit)."""
    top = "\n".join(text.splitlines()[:5])
    assert finding.verdict in top and f"({finding.kind})" in top, top
    if where is not None:
        assert finding.culprit is not None and finding.culprit.where().endswith(where), \
            finding.culprit
        assert where in top, top
    summary = section(text, "Summary")
    assert summary and len(summary.split()) <= 150, summary
    assert not re.search(r"\|\s*None\s*\|", text), "a table cell reads None"
    cause = "\n".join([top, section(text, "Root cause").split("Implicated:")[-1],
                       section(text, "Recommendations")])
    for line in HEALTHY:
        assert line not in cause, f"{line} named as a cause"
    if finding.culprit is not None:
        assert not any(finding.culprit.where().endswith(h) for h in HEALTHY)
