"""What to do about an error whose cause nsadiag knows (nsadiag.verdict.known names the
error and its cause; the advice lives here, with the other next steps)."""

from __future__ import annotations

from nsadiag.verdict.known import READY_TWICE_ERROR

KNOWN_FIXES: dict[str, tuple[str, ...]] = {
    READY_TWICE_ERROR: (
        "bind the block when the checkpoint is made: checkpoint(blk, x), "
        "functools.partial(checkpoint, blk) or `lambda x, blk=blk: blk(x)`",
        "use non-reentrant checkpointing (use_reentrant=False), then verify the "
        "gradients with `nsadiag check ckpt`: a late-bound closure stays silently wrong "
        "there",
        "DDP's static_graph=True only hides the double gradient"),
}


def fixes_for(known_error: str | None) -> list[str]:
    """The fixes of a known error, the first the one to try first; none for another."""
    return list(KNOWN_FIXES.get(known_error or "", ()))
