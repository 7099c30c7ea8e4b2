"""The per-rank table every report of a job with ranks shares (`nsadiag ddp`, `nsadiag run
-- torchrun ...`): each rank named by its host, global rank, local rank and node rank, then
where it stood.

The rows are the verdict's (nsadiag.verdict.ranks.rank_table, kept in its facts). A name
no launcher gave (a rank started without torchrun or Slurm, a record written before ranks
were named) is the word "unknown" in its cell, never a guess; summary.json carries the
same rows, with null for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from nsadiag.fmt import size
from nsadiag.ranknames import RankNames
from nsadiag.report.markdown import md_table
from nsadiag.rundir import TrialRecord
from nsadiag.verdictfacts import RankRow

UNKNOWN = "unknown"
NAME_COLUMNS = (("host", "host"), ("rank", "rank"), ("local rank", "local_rank"),
                ("node rank", "node_rank"))
"""(column heading, row key) of a rank's names, in the order the table shows them."""


def rank_rows(record: TrialRecord) -> list[RankRow]:
    """The per-rank rows of ``record``'s verdict (see the module docstring); [] for a run
    without ranks."""
    return list(record.verdict.facts.ranks.ranks or ())


def _name(row: Mapping[str, Any] | RankRow, key: str) -> str:
    value = getattr(row, key) if isinstance(row, RankRow) else row.get(key)
    return UNKNOWN if value is None or value == "" else str(value)


def name_cells(names: Mapping[str, Any]) -> list[str]:
    """A rank's host, global, local and node rank as the table's cells (NAME_COLUMNS),
    "unknown" where no launcher said."""
    return [_name(names, key) for _, key in NAME_COLUMNS]


def ranks_table(rows: Sequence[RankRow]) -> list[str]:
    """One line per rank: host, global, local and node rank, then pid, state, collectives
    issued, the last one, what it waits in (and for how long), where it is, and how much
    its memory grew per step; a group of ranks folded at a stall is one line, its ranks
    and the rank it is read as in the rank column."""
    import pandas as pd

    if not rows:
        return ["No rank reported."]

    def waiting(row: RankRow) -> Any:
        if row.waiting and row.waiting_since_s is not None:
            return f"{row.waiting}, {row.waiting_since_s:.1f} s"
        return row.waiting

    columns: dict[str, list[Any]] = {
        heading: [_name(r, key) if not r.folded or key == "host" else
                  (r.folded if key == "rank" else "") for r in rows]
        for heading, key in NAME_COLUMNS}
    columns.update({
        "pid": [r.pid for r in rows], "state": [r.state for r in rows],
        "collectives issued": [r.issued for r in rows],
        "last collective": [r.last_collective for r in rows],
        "waiting in": [waiting(r) for r in rows],
        "position": [r.position for r in rows],
        "memory / step": [size(r.memory_per_step) if r.memory_per_step is not None else None
                          for r in rows]})
    return md_table(pd.DataFrame(columns, dtype=object))


def rank_heading(rank: Mapping[str, Any]) -> str:
    """"Rank 3 on host2 (local rank 1, node 1)" for a rank of the record (a
    RankEvidence's dict), "Rank 3" when no launcher named it."""
    names = rank.get("names")
    if not isinstance(names, dict) or not names:
        return f"Rank {rank['rank']}"
    label = dataclasses.replace(RankNames.from_dict(names), rank=rank["rank"]).label()
    return label[:1].upper() + label[1:]


def job_hosts(record: TrialRecord, rows: Sequence[RankRow]) -> list[str]:
    """The job's hosts: those the rows name, in the order of their first rank, then any
    other host the record's shared view lists (one lost before its ranks were
    published)."""
    view = record.evidence.hosts if record.evidence is not None else None
    listed = view.get("hosts") if isinstance(view, dict) else None
    found = [row.host for row in rows if not row.folded] + (
        listed if isinstance(listed, list) else [])
    return list(dict.fromkeys(h for h in found if isinstance(h, str) and h))
