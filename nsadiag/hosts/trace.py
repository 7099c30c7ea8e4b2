"""The Chrome trace of a multi-host job (chrome://tracing, Perfetto): one process per host
(named by the host), one thread per rank (named by its global, local and node rank), each
rank's collectives as spans (a collective still open at the stop ends there: it never
completed), its steps as instants, and the stall as an instant on every host (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nsadiag.hosts.merged import HostsView
from nsadiag.verdict.ranks import RankEvidence, rank_label


def _us(t: float, origin: float) -> float:
    return round((t - origin) * 1e6, 1)


def hosts_trace(ranks: Sequence[RankEvidence], view: HostsView, stopped_at: float
                ) -> dict[str, Any]:
    """The trace of ``ranks`` across ``view``'s hosts, up to ``stopped_at``."""
    hosts = sorted({(r.names or {}).get("host") or view.host for r in ranks})
    pid = {host: i + 1 for i, host in enumerate(hosts)}
    times = [e["t"] for r in ranks for e in r.events if isinstance(e.get("t"), (int, float))]
    origin = min(times, default=stopped_at)
    events: list[dict[str, Any]] = []
    for host in hosts:
        events.append({"name": "process_name", "ph": "M", "pid": pid[host], "tid": 0,
                       "args": {"name": host}})
    for rank in ranks:
        process = pid[(rank.names or {}).get("host") or view.host]
        events.append({"name": "thread_name", "ph": "M", "pid": process, "tid": rank.rank,
                       "args": {"name": rank_label(rank)}})
        opened: dict[int, dict[str, Any]] = {}
        for event in rank.events:
            t = event.get("t")
            if not isinstance(t, (int, float)):
                continue
            if event.get("kind") == "collective" and event.get("edge") == "start":
                opened[event.get("n")] = event
            elif event.get("kind") == "collective" and event.get("edge") == "end":
                began = opened.pop(event.get("n"), None)
                if began is not None:
                    events.append(_span(began, t, process, rank.rank, origin,
                                        event.get("status") or "ok"))
            elif event.get("kind") == "step":
                events.append({"name": f"step {event.get('step')} done", "ph": "i", "s": "t",
                               "ts": _us(t, origin), "pid": process, "tid": rank.rank})
        for began in opened.values():
            events.append(_span(began, stopped_at, process, rank.rank, origin,
                                "open at the stop"))
    if view.stall is not None:
        for host in hosts:
            events.append({"name": f"stall decided by {view.stall.get('host')}", "ph": "i",
                           "s": "p", "ts": _us(float(view.stall.get("t", stopped_at)),
                                               origin),
                           "pid": pid[host], "tid": 0})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"hosts": hosts, "mode": view.mode}}


def _span(began: dict[str, Any], end: float, pid: int, tid: int, origin: float,
          status: str) -> dict[str, Any]:
    return {"name": f"{began.get('op')} #{began.get('n')}", "ph": "X", "cat": "collective",
            "ts": _us(began["t"], origin), "dur": max(_us(end, began["t"]), 0.0),
            "pid": pid, "tid": tid, "args": {"detail": began.get("detail"), "status": status}}
