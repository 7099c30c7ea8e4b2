"""Sockets: a read on a socket (the kernel's read/recv on a descriptor that is one).

The connection's addresses, the process of this machine that holds the other end (its pid
and command, from /proc) and where it stands when it was sampled; an end on another
machine (or one this machine does not show) is said to be out of sight.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsadiag.evidence import StackFrame, ThreadStack
from nsadiag.verdict.waits.model import (
    End,
    Family,
    Hop,
    Proc,
    WaitChain,
    Waiting,
    at,
    doing,
    label,
    main_thread,
    own_frame,
    said_at,
    short_command,
)
from nsadiag.waitfacts import READ_SYSCALLS, SocketEnd

_SOCKET_TIMEOUT = ("give the socket a timeout (`settimeout(...)`, or the client call's "
                   "`timeout=`) so that a peer that never answers fails the read")
"""The half of a socket chain's Next that holds whatever the peer is."""


def _connection(end: SocketEnd) -> str:
    if end.protocol == "unix":
        return f"a Unix socket{f' ({end.local})' if end.local else ''}"
    if end.protocol == "unknown":
        return "a socket"
    kind = "UDP socket" if end.protocol == "udp" else "TCP connection"
    state = f", {end.state}" if end.state and end.state != "ESTABLISHED" else ""
    return f"a {kind} from {end.local} to {end.remote}{state}"


def _socket_chain(process: Proc, thread: ThreadStack, own: StackFrame | None,
                  end: SocketEnd, others: Sequence[Proc]) -> WaitChain:
    where = f" at {at(own)}" if own is not None else ""
    first = Hop("socket", f"{label(thread)} waits to read fd {end.fd}, {_connection(end)}"
                          f"{where}", at(own) if own else None, own.code if own else None)
    if end.peer_pid is None and end.protocol not in ("tcp", "tcp6", "udp"):
        return WaitChain((first, Hop("unknown", "which process holds the other end is "
                                                "unknown (/proc does not name the peer of "
                                                "this kind of socket)")), "unknown")
    if end.peer_pid is None:
        sight = "is held by no process this machine shows (another container or namespace)" \
            if end.on_this_machine else "is on another machine: what it does is not " \
                                        "visible from here"
        return WaitChain((first, Hop("peer", f"the other end, {end.remote}, {sight}")),
                         "socket-remote", end.remote)
    command = short_command(end.peer_command) or f"pid {end.peer_pid}"
    itself = end.peer_pid == process.sample.pid
    holder = f"this same process (pid {end.peer_pid}): one of its own threads must write " \
             f"to it" if itself else f"pid {end.peer_pid} (`{command}`)"
    second = Hop("peer", f"the other end ({end.remote}) is held by {holder}")
    sampled = next((p for p in others if p.sample.pid == end.peer_pid), None)
    main = main_thread(sampled.sample) if sampled is not None else None
    if itself:
        return WaitChain((first, second), "socket-peer", command)
    if main is not None:
        step = doing(main, sampled)
        text = step.text
        frame = own_frame(main)
        if end.peer_reads_it and frame is not None:  # a read the stack alone calls running
            text = (f"{label(main)} waits to read the same connection at {at(frame)}"
                    f"{f' `{frame.code}`' if frame.code else ''}: each end waits for the "
                    f"other to send")
        return WaitChain((first, second, Hop(step.kind, f"pid {end.peer_pid}: {text}",
                                             step.where, step.code)), "socket-peer", command)
    wait = end.peer_wait
    kernel = wait.wchan or wait.syscall_name if wait is not None else None
    third = Hop("process", f"pid {end.peer_pid}'s main thread waits in the kernel at {kernel} "
                           f"(its Python stack was not sampled)") if kernel else \
        Hop("unknown", f"where pid {end.peer_pid} stands is unknown (it was not sampled)")
    return WaitChain((first, second, third), "socket-peer", command)


def _follow(waiting: Waiting) -> WaitChain | None:
    waits, os_wait = waiting.process.waits, waiting.os_wait
    end = waits.socket(os_wait.first_arg) if waits and os_wait and \
        os_wait.syscall_name in READ_SYSCALLS else None
    if end is None:
        return None
    return _socket_chain(waiting.process, waiting.thread, waiting.own, end, waiting.others)


def _socket_peer(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Make `{subject}` answer (the chain's last hop shows where it stands "
            f"instead), and {_SOCKET_TIMEOUT}{said_at(chain, 0)} rather than holding it.")


def _socket_remote(chain: WaitChain) -> str:
    subject = chain.subject or "it"
    return (f"Find why {subject} sends nothing: it is out of sight from this machine; "
            f"{_SOCKET_TIMEOUT}{said_at(chain, 0)} rather than holding it.")


FAMILY = Family("sockets", _follow, {
    "socket-peer": End("a read on a connection whose other end a process of this machine "
                       "holds", _socket_peer),
    "socket-remote": End("a read on a TCP or UDP connection whose other end is out of sight "
                         "(another machine, or a namespace this one does not show)",
                         _socket_remote),
})
