"""``nsadiag merge DIR...``: the merged verdict from per-host run directories copied
together afterwards (no store needed).

Each directory holds one host's ``nsadiag run`` record (record.json): its own ranks (the
ranks its ``hosts`` facts name as this host's) with their capture, and the stall signal it
saw. The ranks of every directory are decided together (nsadiag.hosts.merged), as each
host's nsadiag decided them through the store. A straggler is looked for in the ranks'
recorded steps (their last events), with where each rank's sampler saw it most (the hot
frames its host's record keeps); where those show none, the latest one a host saw while
the job ran is kept.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from nsadiag.hosts.merged import HostState, HostsView, decide_hosts, hosts_straggler
from nsadiag.rundir import TrialRecord, parse_stored, read_json
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.ranks import RankEvidence
from nsadiag.verdict.straggler import step_paces


def _record(run_dir: Path) -> TrialRecord:
    """A host's record.json, read as ``nsadiag report`` reads one (a regular file inside the
    directory, never through a link, at most MAX_JSON_BYTES, nesting bounded, schema
    checked); ValueError (one line naming the file) otherwise."""
    path = run_dir / "record.json"
    if not os.path.lexists(path):
        raise ValueError(f"merge: {run_dir} holds no record.json (not an nsadiag run "
                         f"directory)")
    try:
        return parse_stored(str(path), TrialRecord.from_dict, read_json(path, str(path)))
    except ValueError as err:
        raise ValueError(f"merge: {str(err).splitlines()[0]}") from None


def _host_state(run_dir: Path, record: TrialRecord) -> tuple[HostState, dict | None]:
    """One host's state and the stall signal it saw, from its parsed record; ValueError
    for a record of no multi-host job, RecordError (one line naming the file and what is
    malformed) for facts of the wrong shape."""
    hosts = record.evidence.hosts if record.evidence is not None else None
    if not isinstance(hosts, dict) or not hosts.get("host"):
        raise ValueError(f"merge: {run_dir} is not a run of a multi-host job (its record "
                         f"names no host)")
    host = str(hosts["host"])

    def parse(stored: list) -> HostState:
        own = [RankEvidence.from_dict(r) for r in stored
               if (r.get("names") or {}).get("host") == host]
        frames = ((hosts.get("frames") or {}).get(host) or {}).items()
        return HostState(host, str((hosts.get("phase") or {}).get(host, "ended")),
                         float((hosts.get("published_at") or {}).get(host) or 0.0),
                         own, {r.rank: step_paces(r.events) for r in own},
                         {int(r): dict(f) for r, f in frames if f})

    stored = (record.evidence.ranks if record.evidence is not None else None) or []
    where = run_dir / "record.json"
    if not isinstance(stored, list):
        raise ValueError(f"merge: {where}: evidence.ranks is {type(stored).__name__}, not a "
                         f"list of ranks")
    for i, rank in enumerate(stored):
        if not isinstance(rank, dict):
            raise ValueError(f"merge: {where}: evidence.ranks[{i}] is "
                             f"{json.dumps(rank)[:40]}, not a rank's record (an object)")
    try:
        state = parse_stored(f"{run_dir / 'record.json'} (evidence.ranks, evidence.hosts)",
                             parse, stored)
    except ValueError as err:
        raise ValueError(f"merge: {err}") from None
    return state, hosts


def merge_run_dirs(run_dirs: Sequence[Path]) -> Verdict:
    """The verdict over every host's ranks of ``run_dirs`` (one per host); ValueError (one
    line) for fewer than two, a directory without a run record, one without host facts
    (not a multi-host ``nsadiag run``), or two directories of the same host."""
    if len(run_dirs) < 2:
        raise ValueError("merge: give two or more run directories, one per host")
    records = [(d, _record(d)) for d in run_dirs]
    states: dict[str, HostState] = {}
    ranks: list[RankEvidence] = []
    stall = None
    seen: list[dict] = []
    for run_dir, record in records:
        state, hosts = _host_state(run_dir, record)
        host = state.host
        if host in states:
            raise ValueError(f"merge: {run_dir} is a second run directory of host {host}")
        states[host] = state
        ranks += state.ranks
        stall = stall or hosts.get("stall")
        if isinstance(hosts.get("straggler"), dict):
            seen.append(hosts["straggler"])
    job = records[0][1].evidence
    if job is None:
        raise ValueError(f"merge: {records[0][0]} holds a record without evidence")
    found = hosts_straggler(states)
    latest = max(seen, key=lambda s: float(s.get("seen_at") or 0.0), default=None)
    view = HostsView("merged", f"merged offline from {len(records)} run directories",
                     False, states, stall,
                     straggler=found.to_dict() if found is not None else latest)
    return decide_hosts(job, ranks, view)
