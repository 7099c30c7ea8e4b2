"""A stopped process: it does not wait at all, it is stopped (by SIGSTOP, SIGTSTP, SIGTTIN
or SIGTTOU, or held by a tracer; ProcessWaits.stopped). Read from the process before any
thread (``stopped_chain``): who can resume it, then where its main thread stands."""

from __future__ import annotations

from nsadiag.evidence import StallEvidence
from nsadiag.verdict.waits.model import (
    End,
    Family,
    Hop,
    Proc,
    WaitChain,
    doing,
    said_at,
    start_thread,
)


def stopped_chain(stall: StallEvidence | None) -> WaitChain | None:
    """The chain of a process that is stopped rather than waiting (ProcessWaits.stopped):
    who can resume it, then where its main thread stands when a sample was taken."""
    waits = stall.waits if stall is not None else None
    stopped = waits.stopped if waits is not None else None
    if waits is None or stopped is None:
        return None
    pid = waits.pid
    if stopped.tracer_pid:
        tracer = " ".join(stopped.tracer_command)[:120] or "command unknown"
        first = Hop("process", f"pid {pid} is held stopped by its tracer, pid "
                               f"{stopped.tracer_pid} (`{tracer}`): it runs again only when "
                               f"the tracer continues it or detaches")
        subject = f"tracer pid {stopped.tracer_pid}"
    else:
        first = Hop("process", f"pid {pid} is stopped (state {stopped.state}): nothing in it "
                               f"runs or waits; a SIGSTOP, SIGTSTP (Ctrl-Z), SIGTTIN or "
                               f"SIGTTOU stopped it, and only SIGCONT resumes it")
        subject = f"pid {pid}"
    hops = [first]
    if stall is not None and stall.samples:
        main = start_thread(stall.samples[-1])
        if main is not None:
            hops.append(doing(main, Proc(stall.samples[-1], waits)))
    return WaitChain(tuple(hops), "stopped", subject)


def _stopped(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    if subject.startswith("tracer"):
        return (f"Continue or detach the {subject} (`c` or `detach` in gdb, or end the "
                f"strace): it holds the process stopped, so the run cannot progress.")
    stands = f" (its main thread stands{said_at(chain, -1)})" if len(chain.hops) > 1 \
        else ""
    return (f"Find what stops {subject}{stands}: an `os.kill(..., signal.SIGSTOP)` or "
            f"`kill -STOP` in the program or its launcher, Ctrl-Z at its terminal "
            f"(SIGTSTP), or a background job reading or writing the terminal "
            f"(SIGTTIN/SIGTTOU: give it `< /dev/null`, or run it in the foreground); "
            f"`kill -CONT` resumes a stopped process.")


FAMILY = Family("stopped processes", None, {
    "stopped": End("the process does not wait at all, it is stopped (by SIGSTOP, SIGTSTP, "
                   "SIGTTIN or SIGTTOU, or held by a tracer)", _stopped),
})
