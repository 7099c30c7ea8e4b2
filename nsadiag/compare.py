"""Two runs side by side: verdict changes and step time / peak memory deltas.

Rows of summary.json (sweep-layers, isolate-branch, triage) are matched by (label,
n_layers); a measurement is compared only when both rows are OK. A delta is a regression
when the later value exceeds the earlier one by more than ``threshold`` (0.2 = +20%).
`nsadiag compare A B` and `nsadiag triage --baseline` both use this module.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

QUANTITIES = ("step_s", "peak_rss")
DEFAULT_THRESHOLD = 0.2


@dataclass
class Delta:
    """One measurement of one matched row: ``change`` is after / before - 1."""

    label: str
    n_layers: int
    quantity: str
    before: float
    after: float
    change: float
    regressed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(row: dict[str, Any]) -> tuple[str, int]:
    return row.get("label") or "", int(row["n_layers"])


def _first_by_key(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    keyed: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        keyed.setdefault(_key(row), row)
    return keyed


def compare_rows(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]],
                 threshold: float = DEFAULT_THRESHOLD) -> list[Delta]:
    """Deltas of every quantity of every (label, n_layers) that is OK in both."""
    if not threshold >= 0:
        raise ValueError(f"regression-threshold: must be >= 0, got {threshold!r}")
    old, new = _first_by_key(before), _first_by_key(after)
    deltas = []
    for key in sorted(old.keys() & new.keys(), key=lambda k: (k[0], k[1])):
        a, b = old[key], new[key]
        if a.get("verdict") != "OK" or b.get("verdict") != "OK":
            continue
        for quantity in QUANTITIES:
            x, y = a.get(quantity), b.get(quantity)
            if not x or y is None or x <= 0:
                continue
            change = y / x - 1.0
            deltas.append(Delta(key[0], key[1], quantity, float(x), float(y), change,
                                change > threshold))
    return deltas


def regressions(deltas: Sequence[dict[str, Any] | Delta]) -> list[dict[str, Any]]:
    """The regressed deltas, as dicts."""
    as_dicts = [d.to_dict() if isinstance(d, Delta) else d for d in deltas]
    return [d for d in as_dicts if d["regressed"]]


def verdict_changes(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """Rows present in both whose verdict differs."""
    old, new = _first_by_key(before), _first_by_key(after)
    return [{"label": key[0], "n_layers": key[1], "before": old[key]["verdict"],
             "after": new[key]["verdict"]}
            for key in sorted(old.keys() & new.keys()) if old[key]["verdict"] !=
            new[key]["verdict"]]


def load_summary(path: Path) -> dict[str, Any]:
    """summary.json of a run directory (or the file itself); ValueError in one line."""
    path = Path(path)
    file = path / "summary.json" if path.is_dir() else path
    try:
        summary = json.loads(file.read_text())
    except OSError as err:
        raise ValueError(f"summary: cannot read {file}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"summary: {file} is not valid JSON ({err})") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("rows"), list):
        raise ValueError(f"summary: {file} has no rows; expected the summary.json of an "
                         f"nsadiag run")
    return summary


def compare_runs(before: Path, after: Path, threshold: float = DEFAULT_THRESHOLD
                 ) -> dict[str, Any]:
    """The comparison of two run directories (or summary.json files)."""
    a, b = load_summary(before), load_summary(after)
    deltas = compare_rows(a["rows"], b["rows"], threshold)
    return {"before": str(before), "after": str(after), "threshold": threshold,
            "headlines": [a.get("headline"), b.get("headline")],
            "verdict_changes": verdict_changes(a["rows"], b["rows"]),
            "deltas": [d.to_dict() for d in deltas], "regressions": regressions(deltas),
            "only_before": sorted(set(map(_key, a["rows"])) - set(map(_key, b["rows"]))),
            "only_after": sorted(set(map(_key, b["rows"])) - set(map(_key, a["rows"])))}
