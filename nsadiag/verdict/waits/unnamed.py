"""What no family names: the frame the thread waits or stands at, and that what would
release it is not named by the evidence. Asked last; it always answers."""

from __future__ import annotations

from nsadiag.verdict.waits.model import End, Family, Hop, WaitChain, Waiting, at, label


def _follow(waiting: Waiting) -> WaitChain:
    thread, frame = waiting.thread, waiting.frame
    here = waiting.own or frame
    if here is None:
        return WaitChain((Hop("unknown", f"{label(thread)}: where it waits is unknown"),),
                         "unknown")
    code = f" `{here.code}`" if here.code else ""
    verb = "waits at" if frame is not None else "stands at"
    return WaitChain((Hop("frame", f"{label(thread)} {verb} {at(here)}{code}", at(here),
                          here.code),
                      Hop("unknown", "what would release it is not named by the evidence")),
                     "unknown")


def _no_cause(chain: WaitChain) -> None:
    """No cause is named where the chain names none: the finding says what it knows."""
    return None


FAMILY = Family("unnamed", _follow, {
    "unknown": End("the evidence names no next hop", _no_cause),
})
