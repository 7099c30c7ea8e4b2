"""The terminal: a read of a terminal (``input()`` at a prompt), a person's answer, the
end."""

from __future__ import annotations

from nsadiag.verdict.waits.model import (
    End,
    Family,
    Hop,
    WaitChain,
    Waiting,
    at,
    hop_of,
    label,
    read_file,
    said_at,
)
from nsadiag.waitfacts import TERMINAL, OpenFile, ProcessWaits, ThreadWait


def _terminal_read(waits: ProcessWaits | None, os_wait: ThreadWait | None) -> OpenFile | None:
    """The terminal the thread is blocked reading (a prompt waiting for its answer); None
    when the read is not of a terminal."""
    read = read_file(waits, os_wait)
    return read if read is not None and TERMINAL.match(read.target) else None


def _follow(waiting: Waiting) -> WaitChain | None:
    terminal = _terminal_read(waiting.process.waits, waiting.os_wait)
    if terminal is None:
        return None
    own, thread = waiting.own, waiting.thread
    where = f" at {at(own)}" if own is not None else ""
    stream = ", its stdin" if terminal.fd == 0 else ""
    return WaitChain((Hop("terminal", f"{label(thread)} waits for a line typed at the "
                                      f"terminal ({terminal.target}, fd {terminal.fd}"
                                      f"{stream}){where}", at(own) if own else None,
                          own.code if own else None),), "terminal-input", terminal.target)


def _terminal_input(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Answer the prompt at the terminal: the program waits"
            f"{said_at(chain, hop_of(chain, 'terminal'))} for "
            f"a line typed at the terminal ({subject}). For runs with no one there, give the "
            f"script its answer another way (the script's own option for it, or stdin "
            f"from a file: `< answers.txt`).")


FAMILY = Family("the terminal", _follow, {
    "terminal-input": End("a read of the terminal (a prompt waiting for its answer)",
                          _terminal_input),
})
