"""summary.json as a typed model: one envelope for every run kind, its kind's fields.

Every run directory's summary.json is ``Summary.to_dict()``: ``schema_version``,
``command`` (the run kind), ``headline``, ``status`` and ``exit_code`` (what nsadiag exits
with for this run), ``verdicts`` (one per trial or check), ``rows`` (each trial's
measurements), ``fits`` (label -> quantity -> fit) and ``failing`` (the first failing
verdict), plus the kind's own fields (``details``), at the top level beside them. The
shape is nsadiag/schemas/summary.schema.json; ``to_dict`` checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nsadiag.ci import EXIT_FAILURE, EXIT_HEALTHY, EXIT_INCONCLUSIVE, EXIT_REGRESSION
from nsadiag.schema import SCHEMA_VERSION, check

KINDS = ("sweep-layers", "isolate-branch", "sweep-seq", "ddp", "check", "triage", "memory",
         "trace", "stacks", "run", "watch", "attach")
"""The run kinds: run.json's command_name, summary.json's command."""
STATUS_OF_EXIT = {EXIT_HEALTHY: "healthy", EXIT_FAILURE: "failure",
                  EXIT_REGRESSION: "regression", EXIT_INCONCLUSIVE: "inconclusive"}
EXIT_OF_STATUS = {**{status: code for code, status in STATUS_OF_EXIT.items()},
                  "measured": EXIT_HEALTHY}


@dataclass
class Summary:
    """What one run found (see the module docstring). ``status`` is healthy, failure,
    regression, inconclusive, or measured (memory, trace, stacks: no verdict)."""

    command: str
    headline: str
    status: str
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    fits: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    failing: dict[str, Any] | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_OF_STATUS[self.status]

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, checked against the summary schema (ValueError if it breaks it)."""
        data = {"schema_version": SCHEMA_VERSION, "command": self.command,
                "headline": self.headline, "status": self.status, "exit_code": self.exit_code,
                "verdicts": self.verdicts, "rows": self.rows, "fits": self.fits,
                "failing": self.failing}
        clash = sorted(set(data) & set(self.details))
        if clash:
            raise ValueError(f"summary: the {self.command} details may not set {clash[0]!r}")
        data.update(self.details)
        check(data, "summary", f"summary of {self.command}")
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Summary:
        """A summary read back from its JSON form (checked against the schema)."""
        check(dict(data), "summary", "summary.json")
        common = {"schema_version", "command", "headline", "status", "exit_code", "verdicts",
                  "rows", "fits", "failing"}
        return cls(data["command"], data["headline"], data["status"], list(data["verdicts"]),
                   list(data["rows"]), dict(data["fits"]), data["failing"],
                   {k: v for k, v in data.items() if k not in common})


def verdict_row(label: str, verdict: str, n_layers: int | None = None,
                seq_len: int | None = None, slow_by: str | None = None) -> dict[str, Any]:
    """One entry of ``verdicts`` (``slow_by``: "defect" or "size" for a SLOW)."""
    return {"label": label, "n_layers": n_layers, "seq_len": seq_len, "verdict": verdict,
            "slow_by": slow_by}
