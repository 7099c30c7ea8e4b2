"""The finding of one trial record: `nsadiag run`, ``nsadiag.watch()``, `nsadiag ddp`, and
the failing trial a sweep or a triage quotes.

From the verdict and its facts (nsadiag.verdict.rules) this decides the kind, picks the
culprit line (nsadiag.finding.culprit), the number that proves the verdict, what to do
next, and a short summary; every number is one the evidence measured, rounded to what it
supports (nsadiag.finding.numbers).
"""

from __future__ import annotations

import re
import shlex
import signal
from dataclasses import dataclass
from typing import Any

from nsadiag.finding import Culprit, Finding, Item, fail, kind_of, ok, warn
from nsadiag.finding.copy_on_read import CopyOnRead, copy_on_read
from nsadiag.finding.culprit import culprit_of, holder_retain
from nsadiag.finding.known_fixes import fixes_for
from nsadiag.finding.next_step import chain_next, slow_next
from nsadiag.finding.numbers import count, duration, share, si, sig, size
from nsadiag.finding.rank_memory import growing_ranks
from nsadiag.finding.source import carried_sources
from nsadiag.ranknames import RankNames
from nsadiag.recordspec import RecordSpec
from nsadiag.rundir import TrialRecord
from nsadiag.verdict import is_failure
from nsadiag.verdict.waits.model import WaitChain
from nsadiag.verdictfacts import RankRow, SlowCause, VerdictFacts


def subject_of(spec: RecordSpec) -> str:
    """What one trial ran, in a few words: "repro.per_token_loop:make, 1 layer, S=256"."""
    if spec.command:
        return f"`{shlex.join(spec.command)}`"
    layers = spec.n_layers
    parts = [spec.target or "nsa"]
    if layers is not None:
        parts.append(f"{layers} layer" + ("s" if layers != 1 else ""))
    if spec.seq_len:
        parts.append(f"S={spec.seq_len}")
    return ", ".join(parts)


def status_of(verdict: str, slow_by: str | None) -> str:
    """summary.json's status of one verdict: failure, inconclusive or healthy."""
    if is_failure(verdict, slow_by):
        return "failure"
    return "inconclusive" if verdict == "INCONCLUSIVE" else "healthy"


def work_counts(record: TrialRecord) -> dict[str, Any]:
    """The counts of the trial's first forward (host reads, compute ops, FLOPs per op,
    the dense block's FLOPs per op): the result's, else the last event carrying them."""
    evidence = record.evidence
    if evidence is None:
        return {}
    if evidence.result is not None and "host_reads_per_step" in evidence.result:
        return evidence.result
    counted = [e for e in evidence.events if "host_reads_per_step" in e]
    return counted[-1] if counted else {}


@dataclass(frozen=True)
class WorkCounts:
    """The counts of one forward that tell a defect (``work_counts``): host reads, compute
    ops, the FLOPs of one op and of a dense block's average op; None where not counted."""

    host_reads_per_step: int | None
    compute_ops_per_step: int | None
    flops_per_op: float | None
    dense_flops_per_op: float | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkCounts:
        return cls(host_reads_per_step=data.get("host_reads_per_step"),
                   compute_ops_per_step=data.get("compute_ops_per_step"),
                   flops_per_op=data.get("flops_per_op"),
                   dense_flops_per_op=data.get("dense_flops_per_op"))


# ---- the proving number ------------------------------------------------------------------------


def defect_proof(record: TrialRecord) -> str | None:
    """The count that says slow by defect: a host read per token, else a loop of tiny
    ops, else the loop counter that reached the sequence length."""
    counts = WorkCounts.from_dict(work_counts(record))
    seq_len = record.spec.seq_len or 0
    reads = counts.host_reads_per_step
    if reads and seq_len and reads >= seq_len:
        return (f"{count(reads)} host reads (`.item()`, `.tolist()`) per step for "
                f"{count(seq_len)} tokens: one per token")
    ops, per_op, dense = (counts.compute_ops_per_step, counts.flops_per_op,
                          counts.dense_flops_per_op)
    if ops and per_op and dense:
        return (f"{count(ops)} compute ops in one forward for {count(seq_len)} tokens, "
                f"{si(per_op, 'FLOP')} each where a dense block's average "
                f"{si(dense, 'FLOP')} ({share(per_op / dense)} of it)")
    findings = record.verdict.facts.slow.slow_findings or []
    return findings[0] if findings else None


def size_proof(facts: VerdictFacts) -> str:
    """Why a SLOW is the work itself: its FLOPs and efficiency beside the dense block's,
    and how much longer it needs."""
    parts = []
    if facts.slow.flops_per_step:
        parts.append(f"{si(facts.slow.flops_per_step, 'FLOP')} per step")
    if facts.slow.efficiency is not None and facts.slow.dense_efficiency:
        parts.append(f"at {share(facts.slow.efficiency)} of the matmul rate (a dense block "
                     f"reaches {share(facts.slow.dense_efficiency)})")
    eta = f"ETA {duration(facts.slow.eta_s)} more" if facts.slow.eta_s else "ETA unknown"
    return (", ".join(parts) + "; " if parts else "still progressing at the kill; ") + eta


def progress_proof(facts: VerdictFacts) -> str:
    """How far a SLOW whose work was not counted got: steps and the last one's time (the
    heartbeat's module-event rate is nsadiag's own count, not a figure a user reads)."""
    parts = []
    if facts.position.steps_done is not None:
        parts.append(f"{count(facts.position.steps_done)} steps done")
    if facts.slow.step_s:
        parts.append(f"the last in {sig(facts.slow.step_s)} s")
    return ", ".join(parts) or "still progressing at the kill"


def cause_proof(cause: SlowCause) -> str:
    """The share of the samples that put a SLOW run in its cause class."""
    share, counted = f"{cause.share:.0%}", f"{cause.samples} of {cause.of_samples}"
    if cause.kind == "data-bound":
        return (f"the main process was in the DataLoader's `__next__` in {share} of its "
                f"samples once training began ({counted})")
    if cause.kind == "recompiles":
        return (f"{cause.recompiles} recompiles in {cause.steps} steps; the compiler "
                f"held {share} of the main process's samples ({counted})")
    if cause.kind == "outside-model":
        return (f"{cause.loaded_at} held {share} of the training samples outside the model's "
                f"modules, backward and optimizer ({counted})")
    if cause.kind == "model-compute":
        return (f"{cause.inner} ({counted} in the model's own work); no loop, data wait or "
                f"recompile stood out")
    return (f"checkpoint recompute in {cause.backward_share:.0%} of the backward's "
            f"samples ({counted})")


def stall_proof(facts: VerdictFacts) -> str:
    """No progress for so long, with the CPU it used and whether the stacks moved."""
    since = facts.position.since_last_event_s
    quiet = f"no progress for {sig(since)} s" if since else "no progress"
    cpu = facts.stall.cpu_fraction
    used = f" while using {share(cpu)} of a CPU" if cpu is not None else ""
    frozen = (f", stacks identical in all {facts.stall.samples} samples"
              if facts.stall.stacks_changed is False and facts.stall.samples else "")
    return quiet + used + frozen


def _rank_name(row: RankRow, many_hosts: bool) -> str:
    """"rank 3", or across hosts "rank 3 on host2 (local rank 1, node 1)" (a row of
    nsadiag.verdict.ranks.rank_table)."""
    if not many_hosts or not row.host:
        return f"rank {row.rank}"
    return RankNames(host=str(row.host), rank=row.rank, local_rank=row.local_rank,
                     node_rank=row.node_rank).label()


def collective_proof(facts: VerdictFacts) -> str:
    """Which collective differs and what each rank waits in, for how long."""
    rows = facts.ranks.ranks or ()
    odd = set(facts.ranks.odd_ranks or [])
    many = len({row.host for row in rows if row.host}) >= 2
    parts = []
    for row in sorted(rows, key=lambda r: r.rank not in odd):
        waiting = re.sub(r", from .*\)$", ")", row.waiting or "no collective")
        since = (f" for {sig(row.waiting_since_s)} s"
                 if row.waiting_since_s is not None else "")
        parts.append(f"{_rank_name(row, many)} waits in {waiting}{since}")
    head = f"collective #{facts.ranks.diverged_at} differs between ranks: " \
        if facts.ranks.diverged_at else ""
    return head + ("; ".join(parts) or "the ranks wait in different collectives")


def _signal_number(facts: VerdictFacts) -> int | None:
    if facts.crash.signal is not None:
        return int(facts.crash.signal)
    try:
        return int(signal.Signals[str(facts.crash.signal_name)])
    except KeyError:
        return None


def crash_proof(record: TrialRecord, facts: VerdictFacts) -> str:
    """Which signal ended which process after how long, and where the ranks' collectives
    diverged when they did (the mismatch a rank died of)."""
    if facts.ranks.lost_hosts:  # a host of a multi-host job went away (nsadiag.hosts)
        return str((record.verdict.reasons or [""])[0])
    number = _signal_number(facts)
    name = facts.crash.signal_name or (f"signal {number}" if number else "a signal")
    numbered = f" (signal {number})" if number is not None and facts.crash.signal_name \
        else ""
    who = f"rank {facts.ranks.rank} " if facts.ranks.rank is not None else ""
    wall = facts.position.wall_s or record.wall_s
    when = f"after {sig(wall)} s" if facts.ranks.rank is None else \
        f"in a job that ran {sig(wall)} s"
    proof = f"{who}killed by {name}{numbered} {when}, without a Python exception"
    met = next((r for r in record.verdict.reasons if " met " in r), None)
    return f"{proof}; {met}" if met and facts.ranks.diverged_at else proof


GROWTH_SHARE = 0.1
"""A growth per step is quoted for an OOM when the steps' growth adds up to this share of
the peak (or the limit) at least."""


def proof_of(record: TrialRecord) -> str | None:
    """The one number that proves the verdict, as a phrase."""
    name, facts = record.verdict_name, record.verdict.facts
    if name == "SLOW" and facts.slow.still_starting:
        return (record.verdict.reasons or ["still starting"])[0].split(", and no ")[0]
    if name == "SLOW" and facts.slow.slow_cause and facts.slow.slow_by != "defect":
        return cause_proof(facts.slow.slow_cause)
    if name == "SLOW":
        return {"defect": lambda: defect_proof(record), "size": lambda: size_proof(facts)
                }.get(facts.slow.slow_by or "", lambda: progress_proof(facts))()
    if name in ("STALL-BUSY", "DEADLOCK"):
        return stall_proof(facts)
    if name == "STALL-COLLECTIVE":
        return collective_proof(facts)
    if name == "ERROR" and facts.crash.exception_type is None and facts.crash.exit_code:
        said = f"; the last line it printed: `{facts.crash.message[:160]}`" \
            if facts.crash.message else ""
        return f"exit code {facts.crash.exit_code} with no Python exception{said}"
    if name == "ERROR":
        message = str(facts.crash.message or "").splitlines()[0][:160] if \
            facts.crash.message else ""
        return f"{facts.crash.exception_type or 'an exception'}: {message}".rstrip(": ")
    if name == "CRASH":
        return crash_proof(record, facts)
    if name == "OOM":
        peak = facts.memory.peak_cuda or facts.memory.peak_rss
        cap = facts.memory.memory_cap_bytes
        growth = facts.memory.rss_growth_per_step or facts.memory.cuda_alloc_growth_per_step
        steps = facts.position.steps_done or 0
        # a growth per step that adds up to little of the peak is not what ran out
        telling = growth and growth > 0 and growth * steps >= GROWTH_SHARE * (peak or cap or 0)
        killed = record.evidence is not None and record.evidence.outcome.oom_killer
        start = f"peak {size(peak)}" if peak else \
            "the kernel's OOM killer sent SIGKILL" if killed else "the allocation failed"
        limit = (f" at the {size(cap)} limit of its memory cgroup" if killed else
                 f" against the {size(cap)} cap") if cap else ""
        return start + limit + (f"; memory grew {size(growth)} per step" if telling else "")
    if name == "INCONCLUSIVE" and facts.position.interrupted:
        return (record.verdict.reasons or ["interrupted before a verdict"])[0]
    if name == "INCONCLUSIVE":
        load = facts.position.load
        got = f", the main thread got {share(load.got)} of the CPU it asked for" \
            if load is not None and load.got is not None else ""
        return (f"load {sig(load.load_per_cpu if load else 0)} per usable CPU{got}: a timing "
                f"this machine can stretch")
    steps = facts.position.steps_done
    if isinstance(steps, dict):  # a job of ranks: the steps of each (the fewest finished)
        fewest = min(steps.values(), default=None)
        return f"{count(fewest)} steps finished on every rank" if fewest is not None else None
    return f"{count(steps)} steps finished" if steps is not None else None


# ---- what to do next -----------------------------------------------------------------------------


def _chain_next(name: str, facts: VerdictFacts) -> str | None:
    """The next step from the end of a stuck run's wait chain, when it names one: for a
    rank that never issued the collective the others wait in, from that rank's own chain."""
    if name not in ("DEADLOCK", "STALL-BUSY", "STALL-COLLECTIVE") or \
            not facts.stall.wait_chain:
        return None
    own = facts.stall.rank_chain
    if name == "STALL-COLLECTIVE" and own:
        said = chain_next(WaitChain.from_dict(own["chain"]))
        return f"On rank {own['rank']}: {said[:1].lower()}{said[1:]}" if said else None
    return chain_next(WaitChain.from_dict(dict(facts.stall.wait_chain.raw)))


def next_action_of(record: TrialRecord, culprit: Culprit | None) -> str:
    """One concrete sentence: the fix at the culprit line, or the next step."""
    return next_action(record.verdict_name, record.verdict.facts, culprit)


REGEX_ENGINE = re.compile(r"sre", re.IGNORECASE)


def native_next(call: str, culprit: Culprit | None, where: str) -> str:
    """The Next of a busy stall inside one native call under the user's line: that call,
    and for the regular-expression engine what makes a match run without end."""
    code = f" (`{culprit.code}`)" if culprit is not None and culprit.code else ""
    head = (f"The call{where}{code} did not return while it was watched: every busy sample "
            f"sat in the native `{call}` under it.")
    if REGEX_ENGINE.search(call):
        return (f"{head} A regular expression with nested repetition (`(\\w+\\s?)*`, "
                f"`(a+)+`) backtracks exponentially on a string it does not match: rewrite "
                f"the pattern without the nesting, bound the input's length, or match with a "
                f"timeout (the `regex` package's `timeout=`).")
    return (f"{head} Run it alone on the input it got to see it hang, then bound its input or "
            f"its time; raise --stall-timeout only if it really takes that long.")


def _exit_next(facts: VerdictFacts, culprit: Culprit | None, where: str) -> str:
    """The Next of a program that ended itself with an exit code and no exception: the
    program decided it, so what to look at is the call that exits, and what it said."""
    code = facts.crash.exit_code
    call = f" (`{culprit.code}`)" if culprit is not None and culprit.code else ""
    said = f" It printed `{facts.crash.message[:120]}` just before." if facts.crash.message \
        else ""
    if culprit is not None and culprit.line:
        return (f"The program ended itself with exit code {code}{where}{call}: fix the "
                f"condition that leads there.{said}")
    return (f"The program ended itself with exit code {code}, no exception and no line "
            f"named: find the `sys.exit({code})` (or `exit`, `os._exit`) it or a library "
            f"it calls reaches.{said}")


def next_action(name: str, facts: VerdictFacts, culprit: Culprit | None) -> str:
    """The next step after verdict ``name`` with its ``facts``, at the culprit line."""
    where = f" at {culprit.where()}" if culprit and culprit.line else ""
    if name == "SLOW" and facts.slow.still_starting:
        return ("Give it a limit longer than its start-up (Python and its imports): "
                "nothing can be judged before its first heartbeat.")
    if name == "SLOW" and facts.slow.slow_by == "defect":
        return (f"Replace the per-token Python loop{where} with tensor ops over all tokens at "
                f"once, with no `.item()` inside it; then run the same command again.")
    if name == "SLOW" and facts.slow.slow_cause:
        return slow_next(facts.slow.slow_cause, facts.position.load)
    if name == "SLOW" and facts.slow.slow_by is None:
        if culprit is not None and culprit.host_read:
            line, code = culprit.host_read.split(" ", 1)
            return (f"Replace the loop{where} with tensor ops over all its iterations at "
                    f"once: its body reads a value on the host once per iteration (line "
                    f"{line} {code}); then run the same command again.")
        if culprit is not None:
            return (f"The time goes to the loop{where}: make its body cheaper or run it "
                    f"fewer times, or give the run more time.")
        more = (f"more than its ETA ({duration(facts.slow.eta_s)})" if facts.slow.eta_s
                else "more time")
        return (f"Give the run {more}, or count its work with `nsadiag sweep-layers "
                f"--target pkg.module:factory` on the model (slow by size or by defect).")
    if name == "SLOW":
        eta = f" (ETA {duration(facts.slow.eta_s)})" if facts.slow.eta_s else ""
        return (f"Nothing is broken: give the run more time{eta} or fewer steps; the time "
                f"goes into the model's own work.")
    chained = _chain_next(name, facts)
    if chained is not None:
        return chained
    if name == "STALL-BUSY":
        if facts.stall.stacks_class == "busy-native" and facts.stall.native_call:
            return native_next(facts.stall.native_call, culprit, where)
        if facts.stall.stacks_class == "busy-native":
            return (f"One native call{where} outlasts the stall timeout: make it smaller, or "
                    f"raise --stall-timeout if it really takes that long.")
        return (f"Make the loop{where} end: what it waits for never changes; bound it or fix "
                f"what should end it.")
    if name == "DEADLOCK":
        return (f"Find what should end the wait{where}: the evidence names no holder or "
                f"producer for it; give the wait a timeout so it fails where it hangs.")
    if name == "STALL-COLLECTIVE":
        return (f"Make every rank issue the same collectives: the one{where} runs on some "
                f"ranks only; issue it on all of them or on none.")
    if name == "ERROR":
        fixes = fixes_for(facts.crash.known_error)
        if fixes:
            return f"{fixes[0][:1].upper()}{fixes[0][1:]}."
        if facts.crash.exception_type is None and facts.crash.exit_code:
            return _exit_next(facts, culprit, where)
        return f"Fix the {facts.crash.exception_type or 'exception'} raised{where}."
    if name == "CRASH" and facts.ranks.lost_hosts:
        lost = ", ".join(f"host {row['host']}" for row in facts.ranks.lost_hosts)
        return (f"Find why {lost} went away (its machine, its kernel log, the scheduler's "
                f"record of the node): its ranks and its nsadiag stopped at once, so nothing "
                f"on it recorded a fault; the other hosts' ranks only lost their peers.")
    if name == "CRASH" and facts.ranks.diverged_at:
        return (f"Make every rank issue the same collectives in the same order{where}: "
                f"the ranks' collectives diverged at #{facts.ranks.diverged_at} and rank "
                f"{facts.ranks.rank} died of {facts.crash.signal_name or 'a signal'} there.")
    if name == "CRASH" and facts.crash.signal == signal.SIGKILL:
        return ("Find who sent SIGKILL: no code inside a process raises it, so it came from "
                "outside (the kernel's OOM killer at a memory limit: `dmesg | grep -i oom`, "
                "the container's or scheduler's memory events; a scheduler's time limit; a "
                "`kill -9`), then raise that limit or lower what the job holds.")
    if name == "CRASH":
        return (f"Look at the native call{where}: the process died of "
                f"{facts.crash.signal_name or 'a signal'}; rerun it under gdb to see the "
                f"native frame.")
    if name == "OOM" and culprit is not None and culprit.retains:
        growth = facts.memory.rss_growth_per_step or facts.memory.cuda_alloc_growth_per_step
        return (f"Keep the value, not the tensor, in `{culprit.retains}`{where}: append "
                f"`.item()` (or a `.detach()`ed tensor), so no step's graph and activations "
                f"outlive the step; memory grew {size(growth)} per step.")
    growth = facts.memory.rss_growth_per_step or facts.memory.cuda_alloc_growth_per_step
    holder = facts.memory.rss_holder or facts.memory.cuda_holder
    if name == "OOM" and growth and growth > 0 and holder:
        return (f"Find what outlives each step: memory grew {size(growth)} per step and "
                f"{holder} took it in step after step without giving it back, so something "
                f"kept across steps holds it (a list of tensors with their graph, a cache); "
                f"keep values (`.item()`, `.detach()`) instead. A larger limit only delays "
                f"the failure.")
    if name == "OOM":
        return ("Lower the peak: gradient checkpointing (--grad-ckpt), a memory-bounded "
                "backend, or a shorter sequence; `nsadiag sweep-seq` shows how it grows.")
    if name == "INCONCLUSIVE" and facts.position.interrupted:
        return "Run it again and let it reach a verdict: it was stopped before one."
    if name == "INCONCLUSIVE":
        return "Run it again on a quieter machine, or with a larger --budget, to settle it."
    return "Nothing to fix: it finished."


# ---- the finding ---------------------------------------------------------------------------


def verdict_sentence(record: TrialRecord) -> str:
    """What the verdict says happened, in one sentence with its numbers."""
    name, facts = record.verdict_name, record.verdict.facts
    if name == "SLOW" and facts.slow.still_starting:
        return "Its time ran out while it was still starting: neither slow work nor a hang."
    if name == "SLOW":
        rate = (f" at {sig(1 / facts.slow.step_s)} steps/s (its last step's pace)"
                if facts.slow.step_s else "")
        done = f", {share(facts.slow.fraction_done)} done" if facts.slow.fraction_done else ""
        return (f"Still progressing when its time ran out{rate}{done}: slow, not stuck "
                f"(no hang).")
    if name == "OK":
        return "It finished every step."
    reason = (record.verdict.reasons or [""])[0]
    return reason[:1].upper() + reason[1:] + ("" if reason.endswith(".") else ".")


def copies_items(record: TrialRecord) -> list[Item]:
    """What nsadiag's own copies left out, one item each: a copy of the output that a full
    disk stopped or whose middle was left out (nsadiag.harness.runcmd.KEPT_HEAD_BYTES),
    and heartbeat files a full disk stopped, whose events came through their slot
    instead (the verdict and the counts are the process's own either way)."""
    evidence = record.evidence
    if evidence is None:
        return []
    copies = list(evidence.output_copies or [])  # each says what stopped it, or what was cut
    beats = [f"the run directory's disk filled: {line}; the progress and counts after it "
             f"came from the process (its heartbeat slot), not the file"
             for line in evidence.heartbeats_lost or []]
    thinned = list(evidence.heartbeats_thinned or [])
    return [warn(text) for text in copies + beats] + [ok(text) for text in thinned]


def trial_items(record: TrialRecord, culprit: Culprit | None) -> list[Item]:
    """The trial's verdict, line and proof as one-line items."""
    name = record.verdict_name
    facts = record.verdict.facts
    mark = fail if is_failure(name, facts.slow.slow_by) else \
        warn if name == "INCONCLUSIVE" else ok
    items = [mark(f"{subject_of(record.spec)}: {name} ({kind_of(name, facts.slow.slow_by)})"
                  f", {record.wall_s:.0f} s")]
    proof = proof_of(record)
    if proof:
        items.append(mark(proof))
    if culprit is not None:
        items.append(fail(f"{culprit.where()}: {culprit.why}") if mark is fail else
                     warn(f"{culprit.where()}: {culprit.why}"))
    items += copies_items(record)
    load = facts.position.load
    if load is not None:
        items.append(warn(f"the machine was contended: load {sig(load.load_per_cpu)} per "
                          f"CPU") if load.contended else
                     ok(f"the machine was not contended (load {sig(load.load_per_cpu)} "
                        f"per CPU)"))
    return items


def cause_items(record: TrialRecord, culprit: Culprit | None) -> tuple[list[Item],
                                                                          list[Item]]:
    """(ruled out, implicated) of one trial, each a measured fact."""
    name, facts = record.verdict_name, record.verdict.facts
    ruled_out: list[Item] = []
    implicated: list[Item] = []
    since = facts.position.since_last_event_s
    if name == "SLOW" and not facts.slow.still_starting:
        gap = f" (the last progress {sig(since)} s before the kill)" if since is not None \
            else ""
        ruled_out.append(ok(f"A hang: it was still progressing when its time ran out{gap}."))
    if name in ("STALL-BUSY", "DEADLOCK", "STALL-COLLECTIVE") and since:
        ruled_out.append(ok(f"A slow run: no heartbeat or sampler pulse for {sig(since)} s."))
    cpu = facts.stall.cpu_fraction
    if name == "DEADLOCK" and cpu is not None:
        ruled_out.append(ok(f"A busy loop: the process used {share(cpu)} of a CPU."))
    if name == "STALL-BUSY" and cpu is not None:
        ruled_out.append(ok(f"A wait on a lock: the process used {share(cpu)} of a CPU."))
    if name in ("ERROR", "CRASH", "OOM"):
        ruled_out.append(ok("A hang: the process ended by itself."))
    load = facts.position.load
    if load is not None and not load.contended:
        ruled_out.append(ok(f"Machine contention: load {sig(load.load_per_cpu)} "
                            f"per usable CPU."))
    if culprit is not None:
        code = f" `{culprit.code}`" if culprit.code else ""
        implicated.append(fail(f"{culprit.where()}{code}: {culprit.why}."))
    if facts.position.cause:
        implicated.append(fail(f"Cause: {facts.position.cause}."))
    if facts.position.last_module and name not in ("OK", "SLOW"):
        implicated.append(fail(f"{facts.position.last_module}: the last module entered or left "
                               f"({facts.position.last_edge} in {facts.position.last_phase} of "
                               f"step {facts.position.last_step})."))
    return ruled_out, implicated


def fragmentation_sentence(record: TrialRecord) -> tuple[str, str] | None:
    """(mark, sentence) of the allocator's state at an OOM (nsadiag.probes.fragmentation):
    fragmented, in use, or not available on this device; None when the process recorded
    no OOM."""
    result = record.evidence.result if record.evidence is not None else None
    found = (result or {}).get("fragmentation")
    if not isinstance(found, dict):
        return None
    if isinstance(found.get("unavailable"), str):
        return "warn", found["unavailable"]
    numbers = [found.get(k) for k in ("reserved", "allocated", "free_in_reserved",
                                      "largest_free_block")]
    if not all(isinstance(n, int) for n in numbers):
        return None
    reserved, allocated, free, largest = numbers
    requested = found.get("requested")
    if found.get("fragmented") and isinstance(requested, int):
        return "fail", (f"fragmented: {size(free)} of the {size(reserved)} the allocator "
                        f"reserved was free, but in pieces: the largest was {size(largest)}, "
                        f"less than the {size(requested)} asked for "
                        f"(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets freed "
                        f"pieces be reused whole)")
    return "ok", (f"not fragmentation: {size(allocated)} of the {size(reserved)} reserved "
                  f"was allocated, {size(free)} free (largest piece {size(largest)})")


def copying_workers(record: TrialRecord) -> CopyOnRead | None:
    """The run's forked workers that copied what they were forked with
    (nsadiag.finding.copy_on_read), None when none did or the memory was not read."""
    evidence = record.evidence
    if evidence is None:
        return None
    return copy_on_read(evidence.process_memory, record.verdict.facts.crash.message)


def _copy_failed(copying: CopyOnRead, record: TrialRecord) -> bool:
    """Whether the copying is what failed the run: a copying worker was killed, the run ran
    out of memory, or its first process died of a SIGKILL nsadiag did not send (what a
    memory limit's killer sends, in a container whose count of OOM kills nsadiag cannot
    read)."""
    outcome = record.evidence.outcome if record.evidence is not None else None
    outside_kill = outcome is not None and outcome.signal == signal.SIGKILL and \
        not outcome.killed_by_runner
    return copying.what_failed or record.verdict_name == "OOM" or outside_kill


def _copy_culprit(record: TrialRecord, copying: CopyOnRead) -> Culprit | None:
    dataset = copying.dataset
    file = dataset.file if dataset is not None else None
    sources = carried_sources(record.evidence.source if record.evidence else None)
    return copying.culprit(sources.display_path(file) if file else None)


def trial_finding(record: TrialRecord, command: str, rerun: str | None = None) -> Finding:
    """The finding of a run of one trial (run, watch, ddp): verdict, kind, culprit,
    proof, next action, summary and items; ``rerun`` is the command that repeats it."""
    name, facts = record.verdict_name, record.verdict.facts
    kind = kind_of(name, facts.slow.slow_by)
    # a SLOW's class (data-bound, recompiles, checkpoint recompute) beside its kind
    said = f"{kind}: {facts.slow.slow_cause.kind}" if name == "SLOW" and \
        facts.slow.slow_cause and facts.slow.slow_by != "defect" else kind
    own_work = name == "SLOW" and facts.slow.slow_cause is not None and \
        facts.slow.slow_cause.kind == "model-compute"
    if own_work:
        said = "no defect found: the model's own work"
    culprit = culprit_of(record)
    proof = proof_of(record)
    next_action = next_action_of(record, culprit)
    copying = copying_workers(record)
    copy_failed = copying is not None and _copy_failed(copying, record)
    if copying is not None and copy_failed:  # what failed: the top block says it
        culprit = _copy_culprit(record, copying) or culprit
        proof = copying.proof()
        if name == "CRASH":  # a SIGKILL from outside: say what sends one
            proof = (f"killed by a SIGKILL nsadiag did not send (what a memory limit sends); "
                     f"before it, {proof}")
        next_action = copying.next_action()
    elif name == "OOM" and culprit is None and record.spec.command:  # a user's own command
        cap = facts.memory.memory_cap_bytes
        limit = f"raise the limit of {size(cap)}" if cap else "give it more memory"
        next_action = (f"Lower what the job holds at once, or {limit}: the Process memory "
                       f"section shows which process held what, private and shared, up to "
                       f"the kill.")
    if rerun and kind != "healthy":
        next_action += f" Rerun: `{rerun}`."
    subject = subject_of(record.spec)
    ran = record.evidence.command if record.evidence is not None else None
    ended = ran.ended if ran is not None else None
    summary = [f"{subject} ended {name} ({said}) after {record.wall_s:.0f} s"
               + (f" ({ended})." if ended else "."),
               verdict_sentence(record)]
    position = next((r for r in record.verdict.reasons
                     if r.startswith("last heartbeat")), None)
    if position and name != "SLOW":
        summary.append(position[:1].upper() + position[1:] + ".")
    if facts.position.cause:
        summary.append(f"Cause: {facts.position.cause}.")
    ruled_out, implicated = cause_items(record, culprit)
    fixes = [f"{fix[:1].upper()}{fix[1:]}." for fix in fixes_for(facts.crash.known_error)][1:]
    results = trial_items(record, culprit)
    for grows in growing_ranks(record.verdict.facts.ranks.ranks or (),
                               lambda holder, growth: holder_retain(record, holder, growth)):
        results.append((fail if name == "OOM" else warn)(grows))
        implicated.append(fail(f"Memory: {grows}."))
    allocator = fragmentation_sentence(record) if name == "OOM" else None
    if allocator is not None:
        mark, sentence = allocator
        results.append({"fail": fail, "ok": ok, "warn": warn}[mark](sentence))
        if mark == "fail" and not copy_failed:
            proof = f"{proof}; {sentence}" if proof else sentence
            fixes.insert(0, "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA "
                            "starts, so the allocator grows its segments instead of leaving "
                            "free pieces too small to use; or free and reallocate large "
                            "buffers less often.")
    if copying is not None:  # whatever the verdict: the memory it will run out of
        cause = copying.cause()
        summary.append(f"Cause: {cause[:1].upper()}{cause[1:]}." if copy_failed else
                       f"Memory: {cause}.")
        results.append((fail if copy_failed else warn)(copying.proof()))
        implicated.append(fail(f"Memory: {cause}."))
        if not copy_failed:
            fixes.insert(0, copying.next_action())
    where = f" at {culprit.where()}" if culprit and culprit.line else ""
    return Finding(command=command, verdict=name, kind=kind,
                   status=status_of(name, facts.slow.slow_by),
                   headline=f"{name} ({said}){where}", subject=subject,
                   next_action=next_action, culprit=culprit, proof=proof, summary=summary,
                   results=results, ruled_out=ruled_out,
                   implicated=implicated, recommendations=fixes,
                   chain=facts.stall.wait_chain.printed if facts.stall.wait_chain else None,
                   line_note="none: no defect found; the time goes into the model's own work"
                   if own_work and culprit is None else None)
