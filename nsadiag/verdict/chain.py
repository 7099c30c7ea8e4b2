"""The wait chain of a stuck process (pure): what its thread waits on, who could release
it, and what that one is doing, each hop from evidence.

``wait_chain(evidence)`` follows, from the thread the stall verdict names (the main thread
first), a few hops through the families of waits (nsadiag.verdict.waits: locks, file
locks, children, compile workers, DataLoader workers, multiprocessing pools, futures,
pipes, the terminal, sockets, joined threads, queues, sleeps and polls; a stopped process
before any of them). A hop the evidence does not name is stated as unknown, never guessed.
The chain's ``end`` (``ENDS``, each owned by one family) is what the next step is derived
from (``advice``, through nsadiag.finding.next_step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nsadiag.evidence import Evidence, StallEvidence
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.waits import follow_thread
from nsadiag.verdict.waits.model import Proc, WaitChain, start_thread
from nsadiag.verdict.waits.stopped import stopped_chain

__all__ = ["add_chain", "stall_chain", "wait_chain"]


def _process(stall: StallEvidence | None, died: Sequence[dict[str, Any]] = (),
             role: str = "this process") -> Proc | None:
    if stall is None or not stall.samples:
        return None
    return Proc(stall.samples[-1], stall.waits, tuple(died), role,
                    forked="DataLoader worker" in role)


def stall_chain(stall: StallEvidence | None, died: Sequence[dict[str, Any]] = (),
                others: Sequence[dict[str, Any]] = ()) -> WaitChain | None:
    """The wait chain of a stalled process: its stall evidence, the exceptions that ended
    its other threads (``died``) and the other processes of the job sampled at the stall
    (``others``: Evidence.others); None without a stack sample."""
    stopped = stopped_chain(stall)
    if stopped is not None:
        return stopped
    process = _process(stall, died)
    if process is None:
        return None
    thread = start_thread(process.sample)
    if thread is None:
        return None
    sampled = [p for p in (_process(StallEvidence.from_dict(o["stall"]), (), str(o.get("role")))
                           for o in others if o.get("stall")) if p is not None]
    return follow_thread(process, thread, sampled)


def wait_chain(evidence: Evidence) -> WaitChain | None:
    """The wait chain of a stalled process's evidence (``stall_chain``)."""
    return stall_chain(evidence.stall, evidence.thread_exceptions, evidence.others)


CHAIN_REASON = "wait chain: "


def add_chain(verdict: Verdict, chain: WaitChain | None) -> None:
    """Put a DEADLOCK's chain, or a STALL-BUSY's that names what it spins on, into the
    verdict's facts ("wait_chain") and its sentence second among its reasons (replacing
    one built from less evidence). A busy process whose chain ends unknown has nothing to
    wait for, and gets none."""
    if chain is None or verdict.name not in ("DEADLOCK", "STALL-BUSY") or \
            verdict.name == "STALL-BUSY" and chain.end == "unknown":
        return
    verdict.facts = verdict.facts.with_facts(wait_chain=chain.to_dict())
    sentence = CHAIN_REASON + chain.printed()
    index = next((i for i, r in enumerate(verdict.reasons) if r.startswith(CHAIN_REASON)),
                 None)
    if index is None:
        verdict.reasons.insert(1, sentence)
    else:
        verdict.reasons[index] = sentence
