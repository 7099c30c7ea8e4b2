"""Run a command in a pseudo-terminal, as a person at a terminal runs it: stdin, stdout and
stderr all on the pty's slave side (so rich shows its live bars and spinners), the output
read from the master side until the command ends or a deadline passes (then its process
group is killed and the run is reported as not ended). With ``answer`` the pty is the
command's controlling terminal and what ``answer`` returns is typed into it (``\x03``:
Ctrl-C, which the terminal turns into SIGINT for the command's process group)."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROWS, COLUMNS = 40, 120
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
"""What rich writes as a live display (spinner, progress bar) starts and ends."""
STATUS_BELOW = re.compile(r"\x1bD\x1bM\x1b7\x1bD\r\x1b\[K[^\x1b]*\x1b8|\x1b7\x1bD\r\x1b\[K\x1b8")
"""nsadiag's status line drawn, or cleared, on the row below a partial line of the
command's output, the cursor put back where the command left it (nsadiag.harness.echo)."""
STATUS_AT_LINE_START = re.compile(r"\r\x1b\[Knsadiag: [^\r\n\x1b]*(?=\r\x1b\[K)")
"""nsadiag's status line drawn at the start of a row, then cleared before what follows."""
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[78DM]|\r")


def screen(output: str) -> str:
    """The text a person reads in the terminal once the run is over: what the command and
    nsadiag wrote, without the status line that was drawn and taken away meanwhile (it is
    drawn between the pieces of a line the command writes in parts, as ``print(a, b)``
    unbuffered does) and without escapes."""
    return ESCAPES.sub("", STATUS_AT_LINE_START.sub("", STATUS_BELOW.sub("", output)))


@dataclass
class PtyRun:
    returncode: int | None  # None: killed at the deadline
    output: str  # stdout and stderr as the terminal received them, escapes included

    @property
    def ended(self) -> bool:
        return self.returncode is not None

    @property
    def showed_live_display(self) -> bool:
        return HIDE_CURSOR in self.output and SHOW_CURSOR in self.output


def _controlling_terminal() -> None:
    """In the child, after its setsid(): take the pty (its stdin) as controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def in_pty(argv: list[str], deadline_s: float, cwd: Path | None = None,
           env: dict[str, str] | None = None,
           answer: Callable[[str], bytes | None] | None = None) -> PtyRun:
    """Run ``argv`` on a fresh pty of ROWS x COLUMNS with TERM=xterm-256color; ``answer``
    hears the output so far after each read (and every half second) and returns what to
    type, or None."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    environ = {**(os.environ if env is None else env), "TERM": "xterm-256color"}
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "CI", "GITHUB_ACTIONS"):
        environ.pop(name, None)  # rich would take these over the terminal itself
    try:
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd,
                                env=environ, start_new_session=True,
                                preexec_fn=_controlling_terminal if answer else None)
    finally:
        os.close(slave)
    chunks: list[bytes] = []
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.5)
            typed = answer(b"".join(chunks).decode(errors="replace")) if answer else None
            if typed:
                os.write(master, typed)
            if not ready:
                if proc.poll() is not None:
                    break  # ended, and a process it left holds the slave side open
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the slave side has closed it
                break
            if not data:
                break
            chunks.append(data)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            return PtyRun(None, b"".join(chunks).decode(errors="replace"))
        returncode = proc.wait(timeout=max(1.0, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        returncode = None
    finally:
        os.close(master)
    return PtyRun(returncode, b"".join(chunks).decode(errors="replace"))
