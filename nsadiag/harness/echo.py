"""The command's output shown on nsadiag's own terminal, never at the command's expense.

The copies of a command's output (nsadiag.harness.runcmd) drain its pipes or
pseudo-terminal into the run directory as the bytes come, and hand each chunk to ``Echo``,
which never blocks them: the chunk joins a bounded buffer, and a thread of its own writes
the buffer to nsadiag's stdout or stderr when they can take it. A terminal that stops
reading (Ctrl-S, a pager left unread, a slow ``tee``) therefore delays the echo, then drops
from it once the buffer is full, and the command never waits on its own writes: its
silence can only be its own. ``not_shown`` counts the bytes that never reached the
terminal, so the run can say so once at the end.

Before each write the thread asks whether the destination can take bytes now (``poll``), so
it never sits in a write a stopped terminal would hold forever; to a pipe it writes only
while more than a quarter of the pipe stays free, which keeps room for nsadiag's own last
lines (the verdict) in a pipe nobody reads, so nsadiag ends when its run ends.

On a terminal, ``Echo`` also keeps one status line of nsadiag's own below the command's
output (its text comes from ``status``, asked for at most every ``STATUS_REDRAW_S``): the
line is cleared before the command's output is written and drawn again after it, once per
batch of output. After a complete
line of output it is drawn on the next line; after a partial one (a progress bar redrawn
with carriage returns) on the row below, with the cursor put back where the command left
it.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import select
import stat
import struct
import termios
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

ECHO_BUFFER_BYTES = 16 << 20
"""Output held for a terminal that does not keep up, at most: hours of a chatty training
log, or a burst of a few seconds of a program that floods its output; beyond it the echo
drops chunks (the run directory keeps them all)."""
FINISH_WAIT_S = 3.0
"""At the end of a run, what is still held is shown while the terminal takes some of it
at least every this many seconds; a terminal that takes nothing for that long gets no
more."""
STATUS_REDRAW_S = 0.5
"""The status line is redrawn at most twice a second."""
WRITE_POLL_S = 0.1
PARTIAL_LINE_WAIT_S = 0.05
"""How long the status line waits below a partial line for the rest of it: a program's
pieces of one line come within microseconds of each other; a progress bar redrawn in
place comes every 0.1 s or more, and its status line is drawn between redraws."""
"""How long the writer waits for a destination to become writable between checks."""
PIPE_WAIT_S = 0.001
"""How long the writer first waits before it looks again at a pipe that has no room to
spare; the wait doubles, up to WRITE_POLL_S, while the pipe is not read (a reader that
keeps up makes room within a millisecond)."""
WRITE_CHUNK = 4096
"""Bytes per write to a terminal: a stopped terminal holds a write that is under way."""
BATCH_BYTES = 1 << 20
"""Output written between two redraws of the status line, at most."""
PIPE_RESERVE_SHARE = 0.25
"""The share of a pipe the echo leaves free for nsadiag's own lines."""

F_GETPIPE_SZ = 1032  # linux/fcntl.h; the fcntl module names it only from Python 3.10 on Linux
CLEAR_LINE = b"\r\x1b[K"
SAVE, RESTORE, DOWN, UP = b"\x1b7", b"\x1b8", b"\x1bD", b"\x1bM"
"""DEC save/restore cursor and index/reverse index (down/up one row, the column kept,
scrolling at the bottom row): VT100, understood by every terminal emulator in use."""


class LiveStatus(Protocol):
    """A status line fed the watch's events (nsadiag.harness.session's ``on_events``) and
    asked for its text at each redraw, from the echo's thread."""

    def on_events(self, events: list[dict[str, Any]]) -> None: ...

    def on_straggler(self, found: dict[str, Any] | None) -> None:
        """Hear the straggler named at a read of the other hosts' states (None: none)."""

    def line(self) -> str | None: ...

    awaits_person: Callable[[int], bool]
    """Whether a process waits for an answer typed at the terminal: the status line says
    so, and the watch's stall clock asks the same one (nsadiag.probes.waits.PersonWait)."""


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino, sa.st_rdev) == (sb.st_dev, sb.st_ino, sb.st_rdev)


def _pipe_capacity(fd: int) -> int | None:
    """The capacity of the pipe ``fd`` in bytes; None when ``fd`` is not a pipe (or the
    kernel does not say)."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        return int(fcntl.fcntl(fd, F_GETPIPE_SZ))
    except OSError:
        return None


def _pipe_room(fd: int, capacity: int) -> int:
    """Bytes that can go into the pipe ``fd`` of ``capacity`` now while
    PIPE_RESERVE_SHARE of it stays free."""
    try:
        queued = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    except OSError:
        queued = 0
    return int(capacity * (1 - PIPE_RESERVE_SHARE)) - queued


def _is_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def _writable(fd: int, timeout_s: float) -> bool:
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(mask & select.POLLOUT for _, mask in poller.poll(timeout_s * 1000))
    except OSError:
        return False


def _columns(fd: int) -> int:
    try:
        return struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, bytes(8)))[1] or 80
    except OSError:
        return 80


class Echo:
    """See the module docstring. ``targets`` are the file descriptors the command's
    outputs are shown on (nsadiag's stdout and stderr), by the index ``offer`` is given;
    ``status`` gives the status line's text (None: none now), drawn on ``status_fd``."""

    def __init__(self, targets: list[int], status: Callable[[], str | None] | None = None,
                 status_fd: int | None = None):
        self.targets = targets
        self.not_shown = [0] * len(targets)
        self._queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self._held = 0
        self._dead: set[int] = set()
        self._cond = threading.Condition()
        self._finishing = False
        self._abandoned = False  # finish() stopped waiting: what is left is not shown
        self._status = status if status_fd is not None else None
        self._status_fd = status_fd
        # per target: whether it shows on the status line's terminal, whether it is a file
        # (written at once: a write to a file never waits for a reader)
        self._shares = [status_fd is not None and _same_file(fd, status_fd) for fd in targets]
        self._files = [_is_file(fd) for fd in targets]
        self._terminals = [os.isatty(fd) for fd in targets]
        self._capacity = [_pipe_capacity(fd) for fd in targets]
        # targets that are one file (stdout and stderr on one terminal) share one entry of
        # ``_partial``: whether the last byte shown there was not a newline
        self._group = [next(j for j in range(i + 1) if j == i or _same_file(fd, targets[j]))
                       for i, fd in enumerate(targets)]
        self._partial = [False] * len(targets)
        self._shown = 0  # bytes written by the thread, so the end can tell it still moves
        self._pipe_wait = PIPE_WAIT_S
        self._drawn: bytes | None = None  # the status line as shown, None: not shown
        self._drawn_at = 0.0
        self._text: str | None = None  # the status text, asked for at most every
        self._text_at = 0.0  # STATUS_REDRAW_S and drawn again after the command's output
        self._thread = threading.Thread(target=self._run, name="nsadiag-echo", daemon=True)
        self._thread.start()

    def offer(self, index: int, chunk: bytes) -> None:
        """Take ``chunk`` for target ``index``: held for the writer, or counted as not shown
        when the buffer is full. Never blocks on the terminal."""
        with self._cond:
            if self._files[index] and index not in self._dead:
                self._write_file(index, chunk)
                return
            if index in self._dead or self._held + len(chunk) > ECHO_BUFFER_BYTES:
                self.not_shown[index] += len(chunk)
                return
            self._queue.append((index, chunk))
            self._held += len(chunk)
            self._cond.notify()

    def _write_file(self, index: int, chunk: bytes) -> None:
        view = memoryview(chunk)
        try:
            while view:
                written = os.write(self.targets[index], view)
                self._partial[self._group[index]] = view[written - 1] != ord("\n")
                view = view[written:]
        except OSError:  # a full disk: the run directory's copy is the one that counts
            self._dead.add(index)
            self.not_shown[index] += len(view)

    def finish(self, wait_s: float = FINISH_WAIT_S) -> None:
        """Let the writer show what is held for up to ``wait_s``, count the rest as not
        shown, and take the status line away."""
        with self._cond:
            self._finishing = True
            self._cond.notify()
        shown = -1
        while self._thread.is_alive() and self._shown != shown:
            shown = self._shown
            self._thread.join(wait_s)
        with self._cond:
            while self._queue:
                index, chunk = self._queue.popleft()
                self.not_shown[index] += len(chunk)
            self._held = 0
            self._abandoned = True
            self._status = None
        self._thread.join(3 * WRITE_POLL_S)  # it ends at its next check
        if self._thread.is_alive():
            return  # held in a write by a stopped terminal: nothing more is written
        self._end_status()

    # ---- the writer thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._finishing:
                    self._cond.wait(STATUS_REDRAW_S if self._status else None)
                if not self._queue and self._finishing:
                    return
                batch = []  # what came meanwhile, shown with one clear and one redraw
                while self._queue and sum(len(chunk) for _, chunk in batch) < BATCH_BYTES:
                    batch.append(self._queue.popleft())
                    self._held -= len(batch[-1][1])
            for item in batch:
                self._show(*item)
            if self._more_of_the_line():
                continue
            self._redraw()

    def _more_of_the_line(self) -> bool:
        """After a partial line on the status line's terminal: whether more output comes
        within PARTIAL_LINE_WAIT_S. A line written in pieces (``print(a, b)`` unbuffered
        writes four) is then shown whole before the status line is drawn again, rather
        than with a clear and a redraw between its pieces."""
        if self._status is None or self._at_line_start():
            return False
        with self._cond:
            if not self._queue and not self._finishing:
                self._cond.wait(PARTIAL_LINE_WAIT_S)
            return bool(self._queue)

    def _show(self, index: int, chunk: bytes) -> None:
        if self._shares[index]:
            self._clear_status()
        view = memoryview(chunk)
        while view:
            with self._cond:
                gone = self._abandoned
            written = None if gone or index in self._dead else self._write_some(index, view)
            if written is None:
                self.not_shown[index] += len(view)
                return
            if written:
                self._partial[self._group[index]] = view[written - 1] != ord("\n")
            view = view[written:]

    def _write_some(self, index: int, view: memoryview) -> int | None:
        """Write part of ``view`` to target ``index`` once it can take it; 0 when it
        cannot yet, None when it is gone (a closed pipe)."""
        fd = self.targets[index]
        if not _writable(fd, WRITE_POLL_S):
            return 0
        capacity = self._capacity[index]
        size = min(len(view), _pipe_room(fd, capacity) if capacity is not None else
                   WRITE_CHUNK if self._terminals[index] else len(view))
        if size <= 0:  # a pipe that keeps its reserve: it is read again in a moment or never
            time.sleep(self._pipe_wait)
            self._pipe_wait = min(2 * self._pipe_wait, WRITE_POLL_S)
            return 0
        try:
            written = os.write(fd, view[:size])
            self._shown += written
            self._pipe_wait = PIPE_WAIT_S
            return written
        except InterruptedError:
            return 0
        except OSError:
            self._dead.add(index)
            return None

    def _put(self, data: bytes) -> bool:
        """Write nsadiag's own bytes to the status terminal whole, only when it takes them
        now (a stopped terminal skips a redraw rather than hold the writer)."""
        fd = self._status_fd
        if fd is None or not _writable(fd, 0):
            return False
        with contextlib.suppress(OSError):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return True
        return False

    def _at_line_start(self) -> bool:
        """Whether the status line's terminal shows the command's output up to a newline."""
        shared = [i for i in range(len(self.targets)) if self._shares[i]]
        return not shared or not self._partial[self._group[shared[0]]]

    def _clear_status(self) -> None:
        if self._drawn is None:
            return
        below = SAVE + DOWN + CLEAR_LINE + RESTORE
        if self._put(CLEAR_LINE if self._at_line_start() else below):
            self._drawn = None

    def _redraw(self) -> None:
        if self._status is None or self._status_fd is None:
            return
        now = time.monotonic()
        if self._drawn is not None and now - self._drawn_at < STATUS_REDRAW_S:
            return
        if self._text is None or now - self._text_at >= STATUS_REDRAW_S:
            try:
                self._text, self._text_at = self._status(), now
            except Exception:  # the status line is a courtesy: it never ends the echo
                self._text = None
        if not self._text:
            return
        line = self._text[:max(10, _columns(self._status_fd) - 1)].encode(errors="replace")
        if self._drawn == line:
            return
        if self._at_line_start():
            shown = CLEAR_LINE + line
        else:  # below the command's partial line, the cursor put back where it was
            shown = DOWN + UP + SAVE + DOWN + CLEAR_LINE + line + RESTORE
        if self._put(shown):
            self._drawn, self._drawn_at = line, now

    def _end_status(self) -> None:
        """Take the status line away, and end the command's partial last line on each
        destination, so what nsadiag prints next starts a line of its own."""
        self._clear_status()
        for index, fd in enumerate(self.targets):
            if self._group[index] != index or not self._partial[index] or \
                    index in self._dead or not _writable(fd, 0):
                continue
            with contextlib.suppress(OSError):  # one byte: writable means it fits
                os.write(fd, b"\n")
