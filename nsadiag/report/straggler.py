"""The straggler in a multi-host run's report: the slow rank a host saw among every
host's ranks while the job progressed (nsadiag.hosts.shared), its figures per step against
the others', and when it was seen (formatting only: the finding is decided in
nsadiag.verdict.straggler, and put in the top block by nsadiag.finding.straggler).
"""

from __future__ import annotations

import time
from typing import Any


def straggler_section(found: dict[str, Any] | None) -> list[str]:
    """The section's lines for the straggler a record's hosts named (its ``hosts``'
    ``straggler``), none when they named none."""
    if not isinstance(found, dict):
        return []
    seen = found.get("seen_at")
    when = (" (last seen at " + time.strftime("%H:%M:%S", time.gmtime(float(seen))) +
            " UTC, from the step times every host published in the job's store)"
            if isinstance(seen, (int, float)) else "")
    return [f"{found['sentence']}{when}.", "",
            "| rank | host | local rank | steps | own s/step | others' own s/step | ratio "
            "| its step s | others wait s/step |",
            "|---|---|---|---|---|---|---|---|---|",
            f"| {found['rank']} | {found.get('host') or '-'} | "
            f"{'-' if found.get('local_rank') is None else found['local_rank']} | "
            f"{found['steps'][0]}-{found['steps'][-1]} | {found['own_s']:.3f} | "
            f"{found['others_own_s']:.3f} | "
            f"{'-' if found.get('ratio') is None else format(found['ratio'], '.1f')} | "
            f"{found['step_s']:.3f} | {found['others_waited_s']:.3f} |"]
