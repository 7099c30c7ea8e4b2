"""The live status line of `nsadiag run`: on a terminal, one line of nsadiag's own below the
command's output with what it watches, its pace and the time to the stall decision; in a
pipe, none (nsadiag.cli.live, nsadiag.harness.echo)."""

from __future__ import annotations

import os
import re
import select
import sys
import textwrap
import time

from nsadiag.cli.live import RunStatus, clock, pace, straggler_text
from nsadiag.harness import echo as echo_module
from nsadiag.harness.echo import Echo
from tests.helpers import REPO, nsadiag
from tests.pty_cli import in_pty

SLOW = textwrap.dedent("""
    import time

    def work(n):
        for t in range(n):  # a slow loop: 20 iterations a second
            time.sleep(0.05)
            if t % 40 == 0:
                print(f"at {t}", flush=True)

    work(240)
""")
DEADLINE_S = 300  # only stops a run that never ends
STATUS = re.compile(r"nsadiag: 1 process, \d+:\d\d \| [^|]+ \| \d+/240, [\d.]+/s, pass ETA "
                    r"\d+:\d\d: loop `t` in work \(slow\.py:\d+\)")


def test_a_slow_script_in_a_terminal_shows_its_pace_before_the_verdict(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    done = in_pty([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(tmp_path / "run"),
                   "--", sys.executable, str(tmp_path / "slow.py")], DEADLINE_S, cwd=REPO)
    assert done.returncode == 0, done.output[-3000:]
    status = STATUS.search(done.output)
    assert status, done.output[-3000:]
    assert status.start() < done.output.index("OK (healthy)")
    # the line is taken away before nsadiag's own verdict, and the program's lines kept
    assert "\r\x1b[K\x1b[32mOK (healthy)" in done.output
    assert all(f"at {t}" in done.output for t in range(0, 240, 40))


def test_piped_output_has_no_status_line(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW.replace("work(240)", "work(60)"))
    done = nsadiag("run", "--out", str(tmp_path / "run"), "--", sys.executable,
                   str(tmp_path / "slow.py"))
    assert done.returncode == 0, done.stderr
    for text in (done.stdout, done.stderr):
        assert "nsadiag: 1 process" not in text and "\x1b[K" not in text


def test_the_line_says_the_step_pace_and_the_time_to_the_stall_decision(tmp_path):
    now = [100.0]
    status = RunStatus(tmp_path, stall_timeout_s=60, startup_grace_s=30,
                       now=lambda: now[0])
    status.on_events([{"kind": "start", "phase": "build", "pid": 4242, "t": 1.0}])
    assert status.line() == "nsadiag: 1 process, 0:00 | progressing"
    status.on_events([{"kind": "start", "phase": "forward", "step": 0, "t": 2.0}] +
                     [{"kind": "step", "phase": "optimizer", "step": i, "t": 2.0 + 2.5 * i}
                      for i in range(5)])
    now[0] += 1
    assert status.line() == "nsadiag: 1 process, 0:01 | progressing | step 5, 2.5 s/step"
    now[0] += 11
    assert status.line() == ("nsadiag: 1 process, 0:12 | no progress for 12 s, stall check "
                             "in 48 s | step 5, the last 12 s ago")
    status.on_events([{"kind": "pulse", "progress": False, "frame": "wait (train.py:9)"}])
    now[0] += 50
    assert status.line() == ("nsadiag: 1 process, 1:02 | no progress for 62 s, past the 60 s "
                             "stall timeout: checking | step 5, the last 62 s ago | in wait "
                             "(train.py:9)")


def test_a_loops_numbers_come_first_and_go_stale_in_a_silence(tmp_path):
    now = [100.0]
    status = RunStatus(tmp_path, stall_timeout_s=60, startup_grace_s=30,
                       now=lambda: now[0])
    status._read_loop = lambda at: None  # the loop as a profile would give it
    status.loop = {"variable": "t", "where": "attend (model.py:88)", "last": 512,
                   "end": 4096, "pass_rate_per_s": 40031.0, "eta_s": 115.0}
    status.on_events([{"kind": "start", "phase": "forward", "pid": 7, "step": 0, "t": 1.0}])
    assert status.line() == ("nsadiag: 1 process, 0:00 | progressing | 512/4096, 40031/s, "
                             "pass ETA 1:55: loop `t` in attend (model.py:88)")
    now[0] += 30  # nothing since: the rate and the ETA read before are not shown as now
    line = status.line()
    assert "40031/s" not in line and "ETA" not in line
    assert line.endswith("| 512/4096 when it went quiet: loop `t` in attend (model.py:88)")


def test_a_straggler_is_named_by_rank_host_and_ratio_while_it_is_named(tmp_path):
    found = {"rank": 3, "host": "host2", "local_rank": 1, "ratio": 2.934}
    assert straggler_text(found) == "straggler: rank 3 on host2, 2.9x"
    # a host no launcher named, the others' own time nil (no ratio)
    assert straggler_text({"rank": 0, "host": None, "ratio": None}) == "straggler: rank 0"
    now = [100.0]
    status = RunStatus(tmp_path, stall_timeout_s=60, startup_grace_s=30,
                       now=lambda: now[0])
    status.on_events([{"kind": "start", "phase": "forward", "pid": 7, "step": 0, "t": 1.0},
                      {"kind": "step", "phase": "optimizer", "step": 0, "t": 2.0}])
    status.on_straggler(found)
    assert status.line() == ("nsadiag: 1 process, 0:00 | progressing | step 1 | straggler: "
                             "rank 3 on host2, 2.9x")
    status.on_straggler(None)  # no longer named at the next read
    assert status.line() == "nsadiag: 1 process, 0:00 | progressing | step 1"


def test_a_prompt_waiting_at_the_terminal_is_said_instead_of_a_stall_countdown(tmp_path):
    now = [0.0]
    prompting = {4242}
    status = RunStatus(tmp_path, stall_timeout_s=60, startup_grace_s=30,
                       now=lambda: now[0], awaits_person=lambda pid: pid in prompting)
    status.on_events([{"kind": "start", "phase": "build", "pid": 4242, "t": 1.0}])
    now[0] = 90
    assert status.line() == ("nsadiag: 1 process, 1:30 | waiting for an answer typed at the "
                             "terminal, no stall check meanwhile")
    prompting.clear()
    assert "stall timeout: checking" in status.line()


def test_the_deadline_is_shown_in_its_last_minutes_and_when_it_is_reached(tmp_path):
    now = [0.0]
    status = RunStatus(tmp_path, stall_timeout_s=60, startup_grace_s=30, deadline_s=900,
                       now=lambda: now[0])
    now[0] = 100
    assert "deadline" not in status.line()
    now[0] = 400
    assert status.line().endswith("stall timeout: checking, deadline in 8:20")
    now[0] = 900
    assert status.line() == "nsadiag: starting, 15:00 | at the deadline: checking"


def test_before_training_the_stall_decision_waits_for_the_start_up_grace(tmp_path):
    now = [0.0]
    status = RunStatus(tmp_path, stall_timeout_s=10, startup_grace_s=30, now=lambda: now[0])
    now[0] = 12
    assert status.line().endswith("no progress for 12 s, stall check in 18 s")


def test_times_and_paces_read_as_a_person_says_them():
    assert clock(5) == "0:05" and clock(125) == "2:05" and clock(3725) == "1:02:05"
    assert pace(4.0, "step") == "4.0 steps/s" and pace(0.5, "step") == "2.0 s/step"


def _read_until(fd: int, wanted: bytes, seen: bytearray, deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while wanted not in seen and time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            seen.extend(os.read(fd, 65536))


def test_the_line_goes_below_a_partial_line_and_the_cursor_comes_back():
    master, slave = os.openpty()
    try:
        echo = Echo([slave], status=lambda: "STATUS", status_fd=slave)
        echo.offer(0, b"50%")  # a progress bar redrawn in place, no newline yet
        seen = bytearray()
        _read_until(master, b"STATUS", seen)
        drawn = bytes(seen)
        assert drawn.startswith(b"50%")
        # a row made below (scrolling if need be), the cursor saved on the bar's row, the
        # line drawn below it, the cursor put back after "50%"
        assert b"\x1bD\x1bM\x1b7\x1bD\r\x1b[KSTATUS\x1b8" in drawn
        echo.offer(0, b"\r60%\n")
        _read_until(master, b"60%", seen)
        after = bytes(seen[len(drawn):])
        assert after.startswith(b"\x1b7\x1bD\r\x1b[K\x1b8\r60%")  # cleared, then the bar
        echo.finish()
    finally:
        os.close(master)
        os.close(slave)


def test_a_line_written_in_pieces_is_shown_whole_before_the_line_is_drawn_again(monkeypatch):
    """`print("stdout is a terminal:", True)` unbuffered writes four pieces: the status line
    waits for the rest of a partial line (PARTIAL_LINE_WAIT_S, made long here so that a
    busy machine cannot split the pieces) instead of being drawn between them."""
    monkeypatch.setattr(echo_module, "PARTIAL_LINE_WAIT_S", 30.0)
    master, slave = os.openpty()
    try:
        echo = Echo([slave], status=lambda: "STATUS", status_fd=slave)
        seen = bytearray()
        echo.offer(0, b"stdout is a terminal:")
        _read_until(master, b"terminal:", seen)
        for piece in (b" ", b"True", b"\n"):
            echo.offer(0, piece)
        _read_until(master, b"True\r\n\r\x1b[KSTATUS", seen)
        shown = bytes(seen)
        assert b"stdout is a terminal: True\r\n\r\x1b[KSTATUS" in shown
        echo.finish()
    finally:
        os.close(master)
        os.close(slave)
