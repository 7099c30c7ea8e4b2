"""Sleeps and polls: a ``while`` loop around a sleep polls its condition; a sleep in
straight code or a ``for`` loop is a sleep, with the time written in the line."""

from __future__ import annotations

import re

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.verdict.waits.model import (
    End,
    Family,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    at_scope,
    hop_of,
    label,
    own_frame,
    said_at,
)

SLEEP = re.compile(r"\bsleep\(|nanosleep")
TRAILING_COMMENT = re.compile(r"\s+#[^'\"]*$")
SLEEP_SECONDS = re.compile(r"\bsleep\(\s*(\d[\d_]*(?:\.\d+)?)\s*\)")


def _poll_chain(process: Proc, thread: ThreadStack) -> WaitChain | None:
    """A loop around a sleep in the user's own frame: what its condition polls."""
    scopes = process.waits.scopes if process.waits else ()
    own = own_frame(thread)
    sleeping = own is not None and bool(SLEEP.search(own.code or "")) or any(
        SLEEP.search(f.function) for f in thread.frames if f.is_native)
    scope = next((s for s in scopes if s.thread_id == thread.thread_id and own is not None
                  and s.file == own.file and s.line == own.line), None)
    if not sleeping:
        return None
    if scope is None or scope.loop is None or not scope.loop[0].startswith("while"):
        # a sleep in straight code or in a `for` loop waits for its time, not for a condition
        return _sleep_chain(thread, own)
    header, line = scope.loop
    condition = header.removeprefix("while ").removesuffix(":")
    return WaitChain((Hop("poll", f"{label(thread)} polls `{condition}` in a sleep loop at "
                                  f"{at_scope(scope.file, line)}, still looping at the stall",
                          at_scope(scope.file, line), header),), "poll", condition)


def _sleep_chain(thread: ThreadStack, own: StackFrame | None) -> WaitChain | None:
    """A sleep written in the user's own line (not in a polling loop): the line, and the
    time it asks for when that is a number written there."""
    if own is None or not own.code or not SLEEP.search(own.code):
        return None
    literal = SLEEP_SECONDS.search(own.code)
    asked = f" ({float(literal[1].replace('_', '')):g} s, as written)" if literal else ""
    call = TRAILING_COMMENT.sub("", own.code)
    return WaitChain((Hop("sleep", f"{label(thread)} sleeps at {at(own)} `{own.code}`{asked}",
                          at(own), own.code),), "sleep", call)


def _follow(waiting: Waiting) -> WaitChain | None:
    return _poll_chain(waiting.process, waiting.thread)


def _poll(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Add a timeout to the polling loop{said_at(chain, hop_of(chain, 'poll'))} "
            f"(raise once `{subject}` has held past a deadline), and make sure what should "
            f"end it runs.")


def _sleep(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Remove or shorten the sleep{said_at(chain, hop_of(chain, 'sleep'))} "
            f"(`{subject}`): the thread does nothing else while it sleeps, and the evidence "
            f"shows no other work going on.")


FAMILY = Family("sleeps and polls", _follow, {
    "poll": End("a loop polls a condition", _poll),
    "sleep": End("a sleep written in the user's line, outside a polling loop", _sleep),
})
