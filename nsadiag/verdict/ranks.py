"""Per-rank evidence of a DDP trial and the verdict across ranks (pure: no I/O, no clock).

`RankEvidence` holds what the parent saw of one rank: its last heartbeat events, the
collectives it started (see nsadiag.harness.collectives), its result, and its stall samples.
`decide_ranks(job, ranks)` names the verdict of the whole job:

1. every rank finished ok and the launcher exited 0                  -> OK
2. a rank died of a signal (its fatal-error dump or torchrun's log
   says which) or vanished without a result, while every rank that
   raised only lost its connection to it                             -> CRASH of that rank,
   explained by what it left (the dump's frame, stderr's last words)
   and by where the ranks' collectives diverged before it died
3. the earliest exception of any rank is a collective failure
   (a process-group timeout, a peer that went away)                  -> STALL-COLLECTIVE
4. the earliest exception is anything else                           -> that rank's verdict
   (ERROR / OOM from nsadiag.verdict, with its explanation)
5. the runner stopped a silent job and some rank waits in a
   collective (an unfinished collective in its heartbeats, or stacks
   inside one)                                                       -> STALL-COLLECTIVE
6. otherwise the verdict of the rank that stands out (or rank 0), from nsadiag.verdict.

A STALL-COLLECTIVE says which rank waits in which collective (#n, op, what it is, since
when) and where every other rank is (module and pass of its last heartbeat, collectives
issued), and which rank diverged: at the first collective number whose kind differs
between ranks, the rank in the minority, or, between two equal groups, the rank whose
collective there differs from the one it issued at the same place in the previous step.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nsadiag.evidence import Evidence, StallEvidence
from nsadiag.probes.frames import find_collective, odd_ones_out, rendezvous_frame, user_frame
from nsadiag.probes.frames import main_thread as frames_main_thread
from nsadiag.ranknames import RankNames
from nsadiag.verdict.chain import wait_chain
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.rules import decide
from nsadiag.verdict.waits.model import Hop, WaitChain, at

COLLECTIVE_FAILURE = re.compile(
    r"timed out waiting|connection closed by peer|connection reset|broken pipe|"
    r"NCCL communicator was aborted|DistBackendError|Watchdog caught collective",
    re.IGNORECASE)
"""Exception messages of a collective that could not complete: gloo raises "Timed out
waiting ... for recv operation to complete" at the process-group timeout and "Connection
closed by peer" when the other side died; NCCL's watchdog reports a collective timeout."""

PEER_GONE = re.compile(r"connection closed by peer|connection reset|broken pipe", re.IGNORECASE)
"""A collective that failed because the other side's process is gone: a consequence."""

STARTED_KEEP = 400
"""The last this many started collectives kept per rank (to find where ranks diverge)."""


@dataclass
class RankEvidence:
    """One rank. ``started`` lists the collective "start" events (oldest first);
    ``collectives`` is nsadiag.harness.collectives.summarize of all its collective events;
    ``state`` the stack classification (probes.frames.classify) when samples were taken;
    ``signature`` the innermost Python frames of its last sample (for clustering);
    ``crash`` what it left when it died of a signal (nsadiag.harness.crash.read);
    ``thread_exceptions`` the exceptions that ended its other threads."""

    rank: int
    pid: int | None
    events: list[dict[str, Any]]
    event_counts: dict[str, int]
    result: dict[str, Any] | None
    started: list[dict[str, Any]] = field(default_factory=list)
    collectives: dict[str, Any] = field(default_factory=dict)
    stall: StallEvidence | None = None
    state: str | None = None
    signature: str = ""
    crash: dict[str, Any] | None = None
    thread_exceptions: list[dict[str, Any]] = field(default_factory=list)
    names: dict[str, Any] | None = None
    """Its host, global, local and node rank (nsadiag.ranknames.RankNames.to_dict)."""
    memory_holder: str | None = None
    """Where its sampled profile saw memory taken step after step and kept ("fn (file:
    line)": the heap's holder, else resident memory's, else CUDA's), None when none."""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stall"] = self.stall.to_dict() if self.stall else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankEvidence:
        stall = data.get("stall")
        return cls(rank=int(data["rank"]), pid=data.get("pid"), events=list(data["events"]),
                   event_counts=dict(data.get("event_counts", {})), result=data.get("result"),
                   started=list(data.get("started", [])),
                   collectives=dict(data.get("collectives", {})),
                   stall=StallEvidence.from_dict(stall) if stall else None,
                   state=data.get("state"), signature=data.get("signature", ""),
                   crash=data.get("crash"),
                   thread_exceptions=list(data.get("thread_exceptions") or []),
                   names=data.get("names"), memory_holder=data.get("memory_holder"))

    def as_evidence(self, job: Evidence) -> Evidence:
        """This rank seen as a single trial: the job's spec, outcome and limits."""
        return dataclasses.replace(job, events=self.events, event_counts=self.event_counts,
                                   result=self.result, stall=self.stall, crash=self.crash,
                                   thread_exceptions=self.thread_exceptions)


def rank_label(rank: RankEvidence) -> str:
    """"rank 3 on host2 (local rank 1, node 1)" when the rank's names are known, else
    "rank 3"."""
    if not rank.names:
        return f"rank {rank.rank}"
    return dataclasses.replace(RankNames.from_dict(rank.names), rank=rank.rank).label()


def many_hosts(ranks: Sequence[RankEvidence]) -> bool:
    """Whether the ranks run on two or more hosts (then each is named with its host)."""
    return len({(r.names or {}).get("host") for r in ranks if r.names}) >= 2


def _named(ranks: Sequence[RankEvidence], every: Sequence[RankEvidence]) -> str:
    """"ranks 0, 1" on one host; "rank 0 on host1 (...), rank 2 on host2 (...)" across
    hosts (``every``: all the job's ranks)."""
    if not many_hosts(every):
        return _ranks_words([r.rank for r in ranks])
    return ", ".join(rank_label(r) for r in ranks)


# ---- where a rank is ----------------------------------------------------------------------


def position(rank: RankEvidence) -> str:
    """"in blocks.1 forward of step 1" from the last module event ("just after blocks.0
    backward of step 1" for an exit edge), or the phase when no module event was written."""
    modules = [e for e in rank.events if e.get("kind") == "module"]
    if not modules:
        phase = rank.events[-1].get("phase") if rank.events else "startup"
        return f"in {phase} (no module heartbeat)"
    last = modules[-1]
    where = f"{last['module']} {last['phase']}"
    where = f"just after {where}" if last.get("edge") == "exit" else f"in {where}"
    return f"{where} of step {last.get('step')}"


def waiting_in(rank: RankEvidence) -> dict[str, Any] | None:
    """The collective the rank waits in: its oldest unfinished one, else the oldest one that
    failed; None when its heartbeats show neither."""
    collectives = rank.collectives or {}
    found = (collectives.get("open") or []) + (collectives.get("failed") or [])
    return found[0] if found else None


def describe_collective(c: dict[str, Any]) -> str:
    """"all_reduce #3 (DDP bucket 0, 41 tensors)"."""
    return f"{c.get('op')} #{c.get('n')} ({c.get('detail')})"


def _signature(c: dict[str, Any]) -> tuple:
    return (c.get("op"), c.get("origin"), c.get("phase"),
            tuple(tuple(s) for s in c.get("shapes") or []))


def _kind(c: dict[str, Any]) -> str:
    issuer = "DDP" if c.get("origin") == "ddp" else "a torch.distributed call"
    return f"{c.get('op')} from {issuer} in {c.get('phase')} of step {c.get('step')}"


def _previous_step_match(rank: RankEvidence, c: dict[str, Any]) -> bool | None:
    """Whether collective ``c`` is what the rank issued at the same place (index within
    its step) in the previous step; None when the previous step is not on record."""
    step = c.get("step")
    if not isinstance(step, int) or step == 0:
        return None
    this_step = [s for s in rank.started if s.get("step") == step]
    before = [s for s in rank.started if s.get("step") == step - 1]
    index = next((i for i, s in enumerate(this_step) if s.get("n") == c.get("n")), None)
    if index is None or len(before) <= index:
        return None
    return _signature(before[index]) == _signature(c)


def divergence(ranks: Sequence[RankEvidence]) -> dict[str, Any] | None:
    """The first collective number at which the ranks disagree: {n, odd (ranks), why}.

    Ranks disagree at n when their n-th collectives differ in op, issuer, pass or shapes,
    or when some rank has not issued an n-th one. None when they agree on every number
    all of them have on record.
    """
    by_rank = {r.rank: {c["n"]: c for c in r.started} for r in ranks}
    numbers = sorted({n for started in by_rank.values() for n in started})
    for n in numbers:
        if all(n not in started for started in by_rank.values()):
            continue
        missing = [rank for rank, started in by_rank.items() if n not in started]
        present = {rank: started[n] for rank, started in by_rank.items() if n in started}
        groups: dict[tuple, list[int]] = defaultdict(list)
        for rank, c in present.items():
            groups[_signature(c)].append(rank)
        if len(groups) == 1 and not missing:
            continue
        if len(groups) == 1:
            c = next(iter(present.values()))
            return {"n": n, "odd": sorted(missing), "why": (
                f"rank(s) {_join(missing)} never issued collective #{n}, which rank(s) "
                f"{_join(sorted(present))} issued ({_kind(c)})")}
        return _split(n, groups, present, {r.rank: r for r in ranks})
    return None


def _split(n: int, groups: dict[tuple, list[int]], present: dict[int, dict[str, Any]],
           ranks: dict[int, RankEvidence]) -> dict[str, Any]:
    sizes = sorted(len(members) for members in groups.values())
    kinds = "; ".join(f"rank(s) {_join(members)}: {_kind(present[members[0]])}"
                      for members in groups.values())
    if sizes[0] < sizes[-1]:
        odd = sorted(r for members in groups.values() if len(members) == sizes[0]
                     for r in members)
        return {"n": n, "odd": odd, "why": f"collective #{n} differs between ranks ({kinds}); "
                f"rank(s) {_join(odd)} are the minority"}
    deviating = [rank for rank, c in present.items()
                 if _previous_step_match(ranks[rank], c) is False]
    keeping = [rank for rank, c in present.items() if _previous_step_match(ranks[rank], c)]
    if deviating and keeping:
        return {"n": n, "odd": sorted(deviating), "why": (
            f"collective #{n} differs between ranks ({kinds}); rank(s) {_join(deviating)} "
            f"issued something other than in the previous step, rank(s) "
            f"{_join(keeping)} the same as before")}
    return {"n": n, "odd": [], "why": f"collective #{n} differs between ranks ({kinds}); "
            f"which side left the common path cannot be told from these ranks"}


def _join(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


# ---- the verdict --------------------------------------------------------------------------


def exception_time(rank: RankEvidence) -> float:
    """When the rank's exception was recorded: its "end" event, else its last event."""
    ends = [e["t"] for e in rank.events if e.get("kind") == "end"]
    if ends:
        return ends[-1]
    return rank.events[-1]["t"] if rank.events else float("inf")


def _failed_ranks(ranks: Sequence[RankEvidence]) -> list[RankEvidence]:
    """Ranks whose result holds an exception, earliest first."""
    failed = [r for r in ranks if (r.result or {}).get("exception")]
    return sorted(failed, key=exception_time)


def _peer_gone(rank: RankEvidence) -> bool:
    exception = (rank.result or {}).get("exception") or {}
    return bool(PEER_GONE.search(str(exception.get("message", ""))))


def _vanished(job: Evidence, ranks: Sequence[RankEvidence], vanished: Sequence[RankEvidence],
              witness: RankEvidence | None) -> Verdict:
    """A rank ended with neither a result nor an exception while the others only lost
    their connection to it (or raised nothing): it died first. What it left says how (its
    fatal-error dump, stderr's last words) and where the ranks' collectives diverged
    before it died says why."""
    first = vanished[0]
    crash = first.crash or {}
    names = ", ".join(f"rank {r.rank}" for r in vanished)
    how = (f"died of {crash['signal']}" if crash.get("signal") else
           "ended without a result or an exception (killed by a signal or the OOM killer)")
    if crash.get("error"):
        how += f" (its faulthandler dump: \"Fatal Python error: {crash['error']}\")"
    if crash.get("where"):
        inside = f"in {crash['call']} called from " if crash.get("call") else "in "
        how += (f" while its main thread was {inside}{crash['where']}"
                if crash.get("thread") == "main" else f" {inside}{crash['where']}")
    reasons = [f"{names} {how}; the runner did not kill it"]
    if witness is not None:
        message = str(witness.result["exception"].get("message", "")).splitlines()[0]
        reasons.append(f"rank {witness.rank} only lost its connection to it: {message}")
    if crash.get("stderr"):
        reasons.append("stderr: " + " / ".join(crash["stderr"]))
    split = divergence(ranks)
    if split is not None:
        reasons.append(mismatch_sentence(split, ranks) or split["why"])
    reasons.append(f"rank {first.rank}: {position(first)} when it died")
    facts = {"rank": first.rank, "world_size": len(ranks), "signal_name": crash.get("signal"),
             "crash": crash or None, "diverged_at": split["n"] if split else None,
             "odd_ranks": split["odd"] if split else [],
             "ranks": rank_table(ranks, job.outcome.ended_at)}
    return Verdict("CRASH", reasons, facts)


def _issued(rank: int, c: dict[str, Any]) -> str:
    """"rank 1's all_reduce #8 (4 bytes) from debug_stat (train.py:17)" or "rank 0's DDP
    gradient all_reduce #8 (37,184 bytes, bucket 0)"."""
    size = f"{int(c['bytes']):,} bytes" if c.get("bytes") is not None else \
        f"shapes {c.get('shapes')}"
    detail = str(c.get("detail") or "")
    if c.get("origin") == "ddp":
        bucket = detail.split(",")[0].removeprefix("DDP ")
        return f"rank {rank}'s DDP gradient {c.get('op')} #{c.get('n')} ({size}, {bucket})"
    caller = detail.rsplit(", from ", 1)[1] if ", from " in detail else None
    return f"rank {rank}'s {c.get('op')} #{c.get('n')} ({size})" + \
        (f" from {caller}" if caller else "")


def mismatch_sentence(split: dict[str, Any], ranks: Sequence[RankEvidence]) -> str | None:
    """The collectives the ranks issued at the number where they diverged, the odd rank's
    first: "rank 1's all_reduce #8 (4 bytes) from debug_stat (train.py:17) met rank 0's
    DDP gradient all_reduce #8 (37,184 bytes, bucket 0)"; None when fewer than two ranks
    issued that number."""
    n = split["n"]
    issued = {r.rank: next((c for c in r.started if c.get("n") == n), None) for r in ranks}
    present = sorted((rank for rank, c in issued.items() if c is not None),
                     key=lambda rank: (rank not in split["odd"], rank))
    if len(present) < 2:
        return None
    first, rest = present[0], present[1:]
    others = " and ".join(_issued(rank, issued[rank]) for rank in rest)
    sizes = {issued[rank].get("bytes") for rank in present}
    differ = "sizes and kinds" if len(sizes) > 1 else "kinds"
    return (f"{_issued(first, issued[first])} met {others}: the ranks' collectives diverged "
            f"at #{n} (their {differ} differ)")


def _is_collective_failure(rank: RankEvidence) -> bool:
    exception = (rank.result or {}).get("exception") or {}
    text = f"{exception.get('type', '')}: {exception.get('message', '')}"
    return bool(COLLECTIVE_FAILURE.search(text))


def rank_table(ranks: Sequence[RankEvidence], now: float | None) -> list[dict[str, Any]]:
    """One row per rank: rank, pid, state, issued, last collective, waiting, position,
    memory growth per step and where its memory is kept."""
    rows = []
    for r in ranks:
        waiting = waiting_in(r)
        last = (r.collectives or {}).get("last")
        since = now - waiting["t"] if waiting and now is not None and waiting.get("t") else None
        names = r.names or {}
        rows.append({"rank": r.rank, "host": names.get("host"),
                     "local_rank": names.get("local_rank"),
                     "node_rank": names.get("node_rank"),
                     "pid": r.pid, "state": r.state or _state_of(r),
                     "issued": (r.collectives or {}).get("issued", 0),
                     "last_collective": describe_collective(last) if last else None,
                     "waiting": describe_collective(waiting) if waiting else None,
                     "waiting_since_s": since, "position": position(r),
                     "memory_per_step": _memory_per_step(r),
                     "memory_holder": r.memory_holder})
    return rows


def _memory_per_step(rank: RankEvidence) -> float | None:
    """The rank's memory growth per step (CUDA allocated where recorded, else resident),
    bytes; None with too few steps in its events."""
    from nsadiag.verdict.rules import memory_growth

    for key in ("cuda_alloc", "rss"):
        growth = memory_growth(rank.events, key)
        if growth is not None:
            return float(growth["per_step"])
    return None


def _state_of(rank: RankEvidence) -> str:
    """The state from heartbeats and result when no stack sample classified it."""
    result = rank.result or {}
    if result.get("status") == "ok":
        return "finished"
    if result.get("exception"):
        return f"raised {result['exception'].get('type')}"
    if waiting_in(rank):
        return "in-collective (heartbeats)"
    return "unknown (no stacks)"


def decide_ranks(job: Evidence, ranks: Sequence[RankEvidence]) -> Verdict:
    """The verdict of a DDP job (see the module docstring)."""
    ranks = sorted(ranks, key=lambda r: r.rank)
    if ranks and all((r.result or {}).get("status") == "ok" for r in ranks) and \
            job.outcome.exit_code == 0:
        return _ok(job, ranks)
    failed = _failed_ranks(ranks)
    vanished = [] if job.outcome.killed_by_runner else [r for r in ranks if r.result is None]
    crashed = [r for r in vanished if (r.crash or {}).get("signal")]
    if failed and vanished and all(_peer_gone(r) for r in failed):
        return _vanished(job, ranks, crashed or vanished, failed[0])
    if crashed and all(_peer_gone(r) for r in failed):
        return _vanished(job, ranks, crashed, failed[0] if failed else None)
    if failed and _is_collective_failure(failed[0]):
        first = failed[0]
        message = str(first.result["exception"].get("message", "")).splitlines()[0]
        return _stall_collective(job, ranks, [
            f"rank {first.rank} gave up on a collective first: "
            f"{first.result['exception'].get('type')}: {message}"])
    if failed:
        return _rank_verdict(job, ranks, failed[0], "raised first")
    outcome = job.outcome
    if outcome.killed_by_runner and outcome.kill_reason == "stall":
        if any(waiting_in(r) or (r.stall and find_collective(r.stall.samples)) for r in ranks):
            return _stall_collective(job, ranks, [])
    joining = [r for r in ranks if _in_rendezvous(r)]
    if outcome.killed_by_runner and outcome.kill_reason == "stall" and joining:
        # a rank waits for the group to form: the ranks that have not joined are where the
        # wait goes on, so its chain reads them as the other processes of the job
        return _rank_verdict(job, ranks, joining[0], "waits for the group to form",
                             siblings=[r for r in ranks if r is not joining[0]])
    focus = _standout(ranks) or (ranks[0] if ranks else None)
    if focus is None:
        return decide(job)
    return _rank_verdict(job, ranks, focus, "stands out")


def _in_rendezvous(rank: RankEvidence) -> bool:
    """Whether the rank's main thread stood inside torch.distributed's setup at the stall
    (nsadiag.probes.frames.rendezvous_frame)."""
    samples = rank.stall.samples if rank.stall else ()
    main = frames_main_thread(samples[-1]) if samples else None
    return main is not None and rendezvous_frame(main) is not None


def _ok(job: Evidence, ranks: Sequence[RankEvidence]) -> Verdict:
    counts = {r.rank: r.result.get("collectives_issued") for r in ranks}
    steps = {r.rank: r.result.get("steps_done") for r in ranks}
    facts = {"world_size": len(ranks), "collectives_issued": counts, "steps_done": steps,
             "wall_s": job.outcome.wall_s, "ranks": rank_table(ranks, None)}
    same = len(set(counts.values())) == 1
    reasons = [f"all {len(ranks)} ranks finished {steps[ranks[0].rank]} of "
               f"{job.total_steps} steps with status ok; the launcher exited 0 in "
               f"{job.outcome.wall_s:.1f} s",
               (f"every rank issued {counts[ranks[0].rank]} collectives" if same else
                f"collective counts differ between ranks: {counts}")]
    return Verdict("OK", reasons, facts)


def _rank_verdict(job: Evidence, ranks: Sequence[RankEvidence], focus: RankEvidence,
                  why: str, siblings: Sequence[RankEvidence] = ()) -> Verdict:
    """The job's verdict from one rank's own evidence; ``siblings``: other ranks its wait
    chain reads as the other processes of the job, each by its last stack sample."""
    evidence = focus.as_evidence(job)
    if siblings:
        evidence = dataclasses.replace(evidence, others=[
            *evidence.others, *({"pid": r.pid, "role": f"rank {r.rank}",
                                 "stall": r.stall.to_dict()} for r in siblings if r.stall)])
    verdict = decide(evidence)
    facts = {**verdict.facts.to_dict(), "rank": focus.rank, "world_size": len(ranks),
             "ranks": rank_table(ranks, job.outcome.ended_at)}
    reasons = [f"rank {focus.rank} {why}: {verdict.reasons[0]}", *verdict.reasons[1:]]
    return Verdict(verdict.name, reasons, facts)


def _standout(ranks: Sequence[RankEvidence]) -> RankEvidence | None:
    """The one rank whose stack signature no other rank shares, when the others agree."""
    alone = odd_ones_out(ranks, lambda r: r.signature)
    return alone[0] if len(alone) == 1 else None


def _stall_collective(job: Evidence, ranks: Sequence[RankEvidence],
                      preface: list[str]) -> Verdict:
    now = job.outcome.ended_at
    table = rank_table(ranks, now)
    split = divergence(ranks)
    odd = set(split["odd"]) if split else set()
    ordered = sorted(table, key=lambda row: (row["rank"] not in odd, row["rank"]))
    sentences = [_rank_sentence(row, ranks) for row in ordered]
    reasons = [*preface, "; ".join(sentences)]
    if split:
        reasons.append(split["why"])
    for r in ranks:
        found = find_collective(r.stall.samples) if r.stall else None
        if found:
            reasons.append(f"rank {r.rank}'s stacks: {found[0].name or 'a thread'} in "
                           f"{found[1].where()} in {found[2]} of {len(r.stall.samples)} "
                           f"samples")
    for r in ranks:
        for record in r.thread_exceptions[-2:]:
            where = f" at {record['where']}" if record.get("where") else ""
            reasons.append(f"rank {r.rank}: thread {record.get('thread') or '?'} died of "
                           f"{record.get('type')}: {record.get('message')}{where}")
    culprit = sorted(odd)
    chain, own = collective_chain(job, ranks, split)
    if chain is not None:
        reasons.insert(len(preface) + 1, f"wait chain: {chain.printed()}")
    facts = {"world_size": len(ranks), "ranks": table, "odd_ranks": culprit,
             "steps_done": {r.rank: r.event_counts.get("step", 0) for r in ranks},
             **({"wait_chain": chain.to_dict()} if chain else {}),
             **({"rank_chain": {"rank": own[0], "chain": own[1].to_dict()}} if own else {}),
             "diverged_at": split["n"] if split else None,
             "waiting": {row["rank"]: row["waiting"] for row in table if row["waiting"]},
             "pg_timeout": bool(preface), "confidence": "high" if culprit else "medium"}
    return Verdict("STALL-COLLECTIVE", reasons, facts)


def _rank_place(rank: RankEvidence) -> str:
    """" at train.py:49" of the rank's own code in its last stack sample; "" without."""
    found = user_frame(rank.stall.samples) if rank.stall and rank.stall.samples else None
    return f" at {at(found[0])}" if found else ""


def _loop_of(rank: RankEvidence) -> tuple[str, int] | None | bool:
    """The loop (header, line) around the rank's own line in its last sample, by the
    scopes read at the stall (nsadiag.probes.scopes); None outside any loop; False when
    unknown (no sample, no scope of that line)."""
    found = user_frame(rank.stall.samples) if rank.stall and rank.stall.samples else None
    waits = rank.stall.waits if rank.stall else None
    if found is None or waits is None:
        return False
    scope = next((s for s in waits.scopes if s.file == found[0].file and
                  s.line == found[0].line), None)
    return False if scope is None else scope.loop


def _ranks_words(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {_join(ranks)}"


def collective_chain(job: Evidence, ranks: Sequence[RankEvidence],
                     split: dict[str, Any] | None) -> tuple[WaitChain | None,
                                                            tuple[int, WaitChain] | None]:
    """The wait chain of a STALL-COLLECTIVE, and (rank, its own chain) for a rank that
    never issued the collective the others wait in (followed as a process of its own,
    nsadiag.verdict.chain.wait_chain):

    uneven-steps        the ranks ahead wait in DDP's gradient collective of a step that the
                        ranks behind never began (their step counts), while those wait in a
                        collective outside the loop the ranks ahead are in (the scopes read
                        at the stall);
    (the rank's own)    the ranks behind issued no collective there: their own chain;
    collective-differs  the ranks issued different collectives at the same number.
    None without a divergence."""
    if split is None:
        return None, None
    waits = {r.rank: waiting_in(r) for r in ranks}
    done = {r.rank: r.event_counts.get("step", 0) for r in ranks}
    ahead = [r for r in ranks if (waits[r.rank] or {}).get("origin") == "ddp"]
    behind = [r for r in ranks if r not in ahead]
    step = min(((waits[r.rank] or {}).get("step") for r in ahead), default=None,
               key=lambda n: -1 if n is None else n)
    loops = {r.rank: _loop_of(r) for r in ranks}
    # the ranks behind left the loop the ranks ahead are still in: their steps ran out
    # (a collective inside that same loop, issued on some ranks only, is not uneven data)
    left = all(loops[r.rank] is not False and loops[a.rank] and
               loops[r.rank] != loops[a.rank] for r in behind for a in ahead)
    if ahead and behind and isinstance(step, int) and left and \
            all(done[r.rank] <= step and waits[r.rank] for r in behind):
        hops = [Hop("collective", f"{_ranks_words([r.rank for r in ahead])} "
                                  f"{'wait' if len(ahead) > 1 else 'waits'} in "
                                  f"{describe_collective(waits[ahead[0].rank])}, the gradients "
                                  f"of step {step}{_rank_place(ahead[0])} ("
                                  + ", ".join(f"rank {r.rank}: {done[r.rank]} steps done"
                                              for r in ahead) + ")")]
        for r in behind:
            hops.append(Hop("collective", f"rank {r.rank} never began step {step}: it ran "
                                          f"{done[r.rank]} steps and waits in "
                                          f"{describe_collective(waits[r.rank])}"
                                          f"{_rank_place(r)}"))
        begun = {r.rank: (waits[r.rank] or {}).get("step", step) + 1 for r in ahead}
        counts = ", ".join(f"rank {r.rank} began {begun[r.rank]}" if r in ahead else
                           f"rank {r.rank} ran {done[r.rank]}" for r in ranks)
        return WaitChain(tuple(hops), "uneven-steps", counts), None
    missing = [r for r in ranks if r.rank in split["odd"] and not waits[r.rank]]
    present = [r for r in ranks if waits[r.rank]]
    if missing and present:
        first = Hop("collective", f"{_named(present, ranks)} "
                                  f"{'wait' if len(present) > 1 else 'waits'} in "
                                  f"{describe_collective(waits[present[0].rank])}"
                                  f"{_rank_place(present[0])}")
        rank = missing[0]
        who = rank_label(rank) if many_hosts(ranks) else f"rank {rank.rank}"
        inner = wait_chain(rank.as_evidence(job)) if rank.stall else None
        lead = Hop("collective", f"{who} never issued #{split['n']}")
        if inner is None:
            return WaitChain((first, lead, Hop("unknown", f"where {who} stands is "
                                                          f"unknown (no stack sample)")),
                             "unknown"), None
        hops = (first, lead, *(Hop(h.kind, f"{who}: {h.text}", h.where, h.code)
                               for h in inner.hops))
        return WaitChain(hops, inner.end, inner.subject), (rank.rank, inner)
    if len(present) >= 2:
        odd = sorted(present, key=lambda r: r.rank not in split["odd"])
        hops = tuple(Hop("collective", f"rank {r.rank} waits in "
                                       f"{describe_collective(waits[r.rank])}{_rank_place(r)}")
                     for r in odd)
        return WaitChain(hops, "collective-differs",
                         describe_collective(waits[odd[0].rank])), None
    return None, None


def _rank_sentence(row: dict[str, Any], ranks: Sequence[RankEvidence]) -> str:
    where = f"is {row['position']} / issued {row['issued']} collectives"
    if row["waiting"] is None:
        rank = next(r for r in ranks if r.rank == row["rank"])
        found = find_collective(rank.stall.samples) if rank.stall else None
        if found:
            return f"rank {row['rank']} waits in {found[1].where()} (stacks) and {where}"
        return f"rank {row['rank']} {where}"
    since = (f" for {row['waiting_since_s']:.1f} s"
             if row["waiting_since_s"] is not None else "")
    return f"rank {row['rank']} waits in {row['waiting']}{since} and {where}"
