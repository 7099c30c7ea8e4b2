"""A rank whose memory grows step after step while the others' does not: the leak of one
rank of a job (a per-rank cache, a list only rank 0 appends to), found from the memory
each rank's heartbeat carries at its step ends (nsadiag.verdict.ranks.rank_table's
``memory_per_step``), cheap and always on, without an allocator history.

``growing_ranks(rows)`` names each rank whose growth is ``MIN_GROWTH_BYTES`` per step or
more and at least ``OUTGROWS`` times the median of the other ranks' (a job whose every rank
grows alike has no odd rank out: the per-process rules say that), with where its sampled
profile saw the memory taken and kept, when it did.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from nsadiag.finding import Culprit
from nsadiag.finding.numbers import size
from nsadiag.verdictfacts import RankRow

MIN_GROWTH_BYTES = 2**20
OUTGROWS = 4.0


def growing_ranks(rows: Sequence[RankRow],
                  retains: Callable[[str, float], Culprit | None] | None = None) -> list[str]:
    """One sentence per rank that outgrows the others (see the module docstring);
    ``retains(holder, growth)`` is the line that keeps what the rank's holder takes (an
    append in its loop), when one is found."""
    grown = [(row, row.memory_per_step) for row in rows if row.memory_per_step is not None]
    if len(grown) < 2:
        return []
    found = []
    for row, growth in grown:
        others = statistics.median(g for r, g in grown if r is not row)
        if growth < MIN_GROWTH_BYTES or growth - others < MIN_GROWTH_BYTES or \
                growth < OUTGROWS * max(others, 0.0):
            continue
        host = f" on {row.host}" if row.host else ""
        line = retains(row.memory_holder, growth) if retains and row.memory_holder else None
        kept = (f"; `{line.retains}` keeps it: {line.where()} `{line.code}` appends to it in "
                f"every pass of its loop" if line is not None and line.retains else
                f"; its profile saw the memory rise under {row.memory_holder}"
                if row.memory_holder else "")
        found.append(f"rank {row.rank}{host}: memory grew {size(growth)} per step, the other "
                     f"ranks' median {size(max(others, 0.0))} per step{kept}")
    return found
