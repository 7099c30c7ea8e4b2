"""Collectives: the ranks of a job that wait in collectives, read across ranks by
nsadiag.verdict.ranks (which builds these chains: a rank that never issued the collective
the others wait in is followed as a process of its own, and its chain ends where its own
ends)."""

from __future__ import annotations

from nsadiag.verdict.waits.model import End, Family, WaitChain, said_at


def _uneven_steps(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Give every rank the same number of steps: the ranks' steps differ "
            f"({subject}), so a rank waits after its last step{said_at(chain, -1)} while "
            f"another waits in the gradient collective of a step it never began. Find "
            f"what ended that rank's loop first: a `return` or `break` taken on that rank "
            f"only (a check of its own batch: make every rank take it together, with "
            f"the flag reduced over the ranks by `all_reduce` before the test), or its "
            f"data running out first (then a `DistributedSampler` with "
            f"`drop_last=True`, or DDP's `join` context).")


def _collective_differs(chain: WaitChain) -> None:
    """The collective verdict's own sentence says it (nsadiag.finding.trial): an extra
    collective on some ranks."""
    return None


FAMILY = Family("collectives", None, {
    "uneven-steps": End("ranks that ran fewer steps wait in a collective after their loop "
                        "while the others wait in a step's gradient collective",
                        _uneven_steps),
    "collective-differs": End("the ranks issued different collectives at the same number",
                              _collective_differs),
})
