"""nsadiag's own output never holds the command up: a terminal that stops reading (Ctrl-S)
or a pipe nobody reads delays or drops the echo of the command's output, never the
command, whose run stays OK; nsadiag says how much was not shown and ends when the run
does (nsadiag.harness.echo)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time

from nsadiag.harness.echo import Echo
from tests.helpers import REPO
from tests.pty_cli import COLUMNS, ROWS

TICKS = 80
CHATTY = textwrap.dedent(f"""
    import sys, time
    for i in range({TICKS}):  # a healthy loop that prints 2 kB every 50 ms
        sys.stdout.write(f"tick {{i}} " + "x" * 2000 + "\\n")
        sys.stdout.flush()
        time.sleep(0.05)
    print("done")
""")
STALL_TIMEOUT = "2"
HANG_GUARD_S = 240  # only stops a run that never ends; no test asserts how long one takes


def _ticks(path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.startswith("tick "))


def test_a_pipe_nobody_reads_never_holds_the_command_or_nsadiag(tmp_path):
    (tmp_path / "chatty.py").write_text(CHATTY)
    out = tmp_path / "run"
    read, write = os.pipe()  # nsadiag's stdout: nobody reads it until nsadiag has ended
    with open(tmp_path / "stderr.txt", "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(out),
                                 "--stall-timeout", STALL_TIMEOUT, "--", sys.executable,
                                 str(tmp_path / "chatty.py")], stdout=write, stderr=stderr,
                                cwd=REPO)
    os.close(write)
    try:
        returncode = proc.wait(timeout=HANG_GUARD_S)
    finally:
        proc.kill()
    shown = b""
    os.set_blocking(read, False)
    while True:
        try:
            chunk = os.read(read, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(read)
    notes = (tmp_path / "stderr.txt").read_text()
    assert returncode == 0, notes
    assert json.loads((out / "summary.json").read_text())["verdict"] == "OK"
    assert _ticks(out / "stdout.txt") == TICKS  # the run directory keeps every line
    assert "bytes of the command's output were not shown in the terminal" in notes
    assert "all of it is in " in notes and "/run/stdout.txt" in notes  # (the user redacted)
    assert re.search(rb"^OK", shown, re.M), shown[-600:]  # the verdict fitted in the pipe


def test_ctrl_s_held_past_the_stall_timeout_leaves_a_healthy_run_ok(tmp_path):
    (tmp_path / "chatty.py").write_text(CHATTY)
    out = tmp_path / "run"
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color"}
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "CI", "GITHUB_ACTIONS"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(out),
                             "--stall-timeout", STALL_TIMEOUT, "--", sys.executable,
                             str(tmp_path / "chatty.py")], stdin=slave, stdout=slave,
                            stderr=slave, cwd=REPO, env=env, start_new_session=True)
    os.close(slave)
    seen = bytearray()
    done = threading.Event()

    def read_all() -> None:
        while not done.is_set():
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                seen.extend(chunk)

    reader = threading.Thread(target=read_all, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while b"tick 5 " not in seen and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b"tick 5 " in seen, bytes(seen[-2000:])
        os.write(master, b"\x13")  # Ctrl-S: the terminal stops showing output
        time.sleep(3 * float(STALL_TIMEOUT))  # held past the stall timeout
        os.write(master, b"\x11")  # Ctrl-Q
        returncode = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        done.set()
        reader.join(timeout=10)
        os.close(master)
    output = bytes(seen).decode(errors="replace")
    assert returncode == 0, output[-3000:]
    assert json.loads((out / "summary.json").read_text())["verdict"] == "OK"
    assert _ticks(out / "stdout.txt") == TICKS
    assert "OK" in output


def test_the_echo_never_blocks_on_a_full_pipe_and_counts_what_it_dropped():
    read, write = os.pipe()
    echo = Echo([write])
    chunk = b"y" * 65536
    offered = 0

    def offer_plenty() -> None:  # 8 MiB into a 64 kB pipe nobody reads
        nonlocal offered
        for _ in range(128):
            echo.offer(0, chunk)
            offered += len(chunk)

    offering = threading.Thread(target=offer_plenty, daemon=True)
    offering.start()
    offering.join(timeout=60)
    assert not offering.is_alive(), "offering output blocked on the pipe"
    echo.finish(wait_s=0.5)
    shown = b""
    os.set_blocking(read, False)
    while True:
        try:
            shown += os.read(read, 65536)
        except BlockingIOError:
            break
    # what was shown, then the newline that ends its partial last line for nsadiag's own
    assert shown.endswith(b"y\n")
    assert echo.not_shown[0] == offered - (len(shown) - 1)
    assert echo.not_shown[0] > 0 and len(shown) > 1
    os.close(read)
    os.close(write)
