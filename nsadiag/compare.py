"""Two runs side by side: verdict changes and step time / peak memory deltas.

Rows of summary.json (sweep-layers, isolate-branch, triage) are matched by (label,
n_layers). Time per step is compared whenever both rows timed finished steps, whatever
their verdicts (a run that did not finish its steps within a budget still measured how
long a step takes); peak memory only when both rows are OK (a killed run's peak is
partial). A delta is a regression when the later value exceeds the earlier one by more
than ``threshold`` (0.2 = +20%) and by more than the noise: the larger relative spread of
the step times the two rows were measured from (unknown with fewer than two measured
steps, then the threshold alone). Time per step is also set against its expected cost on
each run's machine (``cost_ratio``: the step time over the time the dense reference,
timed in the same trial, takes for the step's FLOPs; nsadiag.probes.efficiency): a step
that got slower while its cost ratio did not grow by more than the threshold was slowed
by the machine (busier, or slower), not by the code, and is no regression
(``explained``).
Runs whose configurations differ (spec.json beside summary.json: target, sequence length,
batch, dtype, ...) are not compared unless forced: their difference is the configuration's.
`nsadiag compare A B` and `nsadiag triage --baseline` both use this module.

A run of a user's own command (`nsadiag run`, nsadiag.watch()) has no rows in its
summary.json: it is compared as one row (``command_row``), its verdict, the median time of
its recorded steps (with their spread) and its peak resident memory, read from its
record.json; two such runs of different commands are, like two configurations, compared
only when forced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nsadiag.rundir import check_schema_version, parse_json, read_json
from nsadiag.verdict.names import is_failure

QUANTITIES = ("step_s", "peak_rss")
DEFAULT_THRESHOLD = 0.2
CONFIG_FIELDS = ("target", "seq_len", "batch", "dtype", "grad_ckpt", "device", "backend",
                 "branches", "overrides", "steps")
SPREAD = {"step_s": "step_s_spread"}  # the row field holding a quantity's measured spread


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
    noise: float | None = None
    cost_change: float | None = None  # change of the step time over its expected cost
    explained: bool = False  # the machine's expected cost grew alike: not the code

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _key(row: dict[str, Any]) -> tuple[str, int]:
    return row.get("label") or "", int(row["n_layers"])


def _frame(rows: Sequence[dict[str, Any]]):
    """Rows as a DataFrame keyed by (label, n_layers), the first row of each key kept."""
    import pandas as pd

    columns = ["label", "n_layers", "verdict", *QUANTITIES, *SPREAD.values(), "cost_ratio"]
    frame = pd.DataFrame(list(rows)).reindex(columns=columns)
    frame["label"] = frame["label"].fillna("").astype(str)
    frame["n_layers"] = frame["n_layers"].astype(int)
    return frame.drop_duplicates(["label", "n_layers"], keep="first")


def _matched(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]):
    """The rows present in both, side by side (suffixes _a and _b), sorted by key."""
    if not before or not after:
        return None
    both = _frame(before).merge(_frame(after), on=["label", "n_layers"], suffixes=("_a", "_b"))
    return both.sort_values(["label", "n_layers"], kind="stable")


def compare_rows(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]],
                 threshold: float = DEFAULT_THRESHOLD) -> list[Delta]:
    """Deltas of the step time of every (label, n_layers) both runs timed, and of the peak
    of those OK in both (see the module docstring)."""
    if not threshold >= 0:
        raise ValueError(f"regression-threshold: must be >= 0, got {threshold!r}")
    both = _matched(before, after)
    if both is None:
        return []
    deltas = []
    for row in both.to_dict("records"):
        both_ok = row["verdict_a"] == "OK" and row["verdict_b"] == "OK"
        for quantity in QUANTITIES:
            if quantity != "step_s" and not both_ok:
                continue
            x, y = _number(row[f"{quantity}_a"]), _number(row[f"{quantity}_b"])
            if not x or y is None or x <= 0:
                continue
            change = y / x - 1.0
            field = SPREAD.get(quantity)
            spreads = [s for s in (_number(row.get(f"{field}_a")),
                                   _number(row.get(f"{field}_b"))) if s is not None] \
                if field else []
            noise = max(spreads) if spreads else None
            regressed = change > max(threshold, noise or 0.0)
            cost_change = _cost_change(row) if quantity == "step_s" else None
            explained = regressed and cost_change is not None and cost_change <= threshold
            deltas.append(Delta(row["label"], int(row["n_layers"]), quantity, x, y, change,
                                regressed and not explained, noise, cost_change, explained))
    return deltas


def _cost_change(row: dict[str, Any]) -> float | None:
    """How the step time over its expected cost changed from run a to run b, None when
    either run did not measure it."""
    x, y = _number(row.get("cost_ratio_a")), _number(row.get("cost_ratio_b"))
    return y / x - 1.0 if x and y is not None and x > 0 else None


def _number(value: Any) -> float | None:
    """A measured number, None for a missing one (pandas gives NaN)."""
    return None if value is None or value != value else float(value)


def config_differences(before: dict[str, Any] | None, after: dict[str, Any] | None
                       ) -> list[str]:
    """"field: old -> new" for every CONFIG_FIELDS entry the two specs disagree on; none
    when either spec is unknown."""
    if not before or not after:
        return []
    return [f"{name}: {before.get(name)!r} -> {after.get(name)!r}" for name in CONFIG_FIELDS
            if before.get(name) != after.get(name)]


def regressions(deltas: Sequence[dict[str, Any] | Delta]) -> list[dict[str, Any]]:
    """The regressed deltas, as dicts."""
    as_dicts = [d.to_dict() if isinstance(d, Delta) else d for d in deltas]
    return [d for d in as_dicts if d["regressed"]]


def verdict_changes(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """Rows present in both whose verdict differs; ``failure_now``: the earlier verdict was
    no failure and the later one is (a regression of its own, exit 3)."""
    both = _matched(before, after)
    if both is None:
        return []
    changed = both[both["verdict_a"] != both["verdict_b"]]
    return [{"label": r["label"], "n_layers": int(r["n_layers"]), "before": r["verdict_a"],
             "after": r["verdict_b"],
             "failure_now": not is_failure(str(r["verdict_a"])) and
             is_failure(str(r["verdict_b"]))} for r in changed.to_dict("records")]


def load_summary(path: Path) -> dict[str, Any]:
    """summary.json of a run directory (or the file itself); ValueError in one line."""
    path = Path(path)
    file = path / "summary.json" if path.is_dir() else path
    try:
        summary = parse_json(file.read_bytes(), "summary", file)
    except OSError as err:
        raise ValueError(f"summary: cannot read {file}: {err.strerror or err}") from None
    check_schema_version(summary, "summary")
    if not isinstance(summary, dict) or not isinstance(summary.get("rows"), list):
        raise ValueError(f"summary: {file} has no rows; expected the summary.json of an "
                         f"nsadiag run")
    return summary


def load_spec(path: Path) -> dict[str, Any] | None:
    """spec.json of a run directory (or beside the summary.json), None when absent."""
    path = Path(path)
    file = (path if path.is_dir() else path.parent) / "spec.json"
    try:
        spec = parse_json(file.read_bytes(), "spec", file)
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None


COMMAND_KINDS = ("run", "watch")
"""The runs whose summary.json has no rows: a user's own command, one row each."""


def command_row(path: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The one row of a user's command run: its verdict, the median and relative spread
    of the step times its record kept (the 10th to the 90th percentile over the median: a
    user's first steps warm up, and their outliers are no noise of the steady pace), and
    the largest resident memory among its events; a number it did not record is None."""
    import statistics

    directory = Path(path) if Path(path).is_dir() else Path(path).parent
    try:
        record = read_json(directory / "record.json", "record.json")
    except ValueError:
        record = {}
    evidence = record.get("evidence") if isinstance(record, dict) else None
    events = evidence.get("events") if isinstance(evidence, dict) else None
    events = [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
    steps = [float(e["step_s"]) for e in events if e.get("kind") == "step" and
             isinstance(e.get("step_s"), (int, float)) and e["step_s"] > 0]
    rss = [float(e["rss"]) for e in events if isinstance(e.get("rss"), (int, float))]
    median = statistics.median(steps) if steps else None
    deciles = statistics.quantiles(steps, n=10) if len(steps) >= 2 else None
    return {"label": "the command", "n_layers": 0, "verdict": summary.get("verdict"),
            "step_s": median, "peak_rss": max(rss) if rss else None,
            "step_s_spread": (deciles[-1] - deciles[0]) / median
            if median and deciles else None}


def _rows(path: Path, summary: dict[str, Any]) -> list[dict[str, Any]]:
    if summary.get("command") in COMMAND_KINDS and not summary["rows"]:
        return [command_row(path, summary)]
    return summary["rows"]


def _argv_spec(summary: dict[str, Any]) -> dict[str, Any] | None:
    """A user's command run's configuration: its command line."""
    argv = summary.get("argv")
    return {"target": " ".join(map(str, argv))} if isinstance(argv, list) else None


def compare_runs(before: Path, after: Path, threshold: float = DEFAULT_THRESHOLD,
                 force: bool = False) -> dict[str, Any]:
    """The comparison of two run directories (or summary.json files); ValueError in one
    line when their configurations differ and ``force`` is not set."""
    a, b = load_summary(before), load_summary(after)
    commands = a.get("command") in COMMAND_KINDS and b.get("command") in COMMAND_KINDS
    differences = config_differences(_argv_spec(a), _argv_spec(b)) if commands else \
        config_differences(load_spec(before), load_spec(after))
    a = {**a, "rows": _rows(before, a)}
    b = {**b, "rows": _rows(after, b)}
    if differences and not force:
        raise ValueError(f"compare: the runs' configurations differ ({'; '.join(differences)})"
                         f": a change in time or memory would be the configuration's, not a "
                         f"regression; pass --force to compare anyway")
    deltas = compare_rows(a["rows"], b["rows"], threshold)
    return {"before": str(before), "after": str(after), "threshold": threshold,
            "config_differences": differences,
            "headlines": [a.get("headline"), b.get("headline")],
            "verdict_changes": verdict_changes(a["rows"], b["rows"]),
            "deltas": [d.to_dict() for d in deltas], "regressions": regressions(deltas),
            "only_before": sorted(set(map(_key, a["rows"])) - set(map(_key, b["rows"]))),
            "only_after": sorted(set(map(_key, b["rows"])) - set(map(_key, a["rows"])))}
