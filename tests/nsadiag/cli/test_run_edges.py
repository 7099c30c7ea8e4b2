"""`nsadiag run` at its edges: nothing outlives it (a helper that drops nsadiag's token
and double-forks into a session of its own included), a full disk stops only the copies of
the output, a reused --out keeps the earlier run whole until the new one has its verdict,
a command that cannot start leaves nothing and says why, a stop during start-up is one
line, and a deadline shorter than Python's start-up is not a DEADLOCK."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import psutil
import pytest

from nsadiag.harness import runcmd
from nsadiag.harness.echo import Echo
from tests.helpers import REPO, checkout_env, nsadiag
from tests.procs import wait_for

# ---- nothing outlives a diagnosis -----------------------------------------------------------

STRIPPING_HELPER = textwrap.dedent("""
    import os, sys, time
    delay, pid_file = float(sys.argv[1]), sys.argv[2]
    time.sleep(delay)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            env = {k: v for k, v in os.environ.items() if not k.startswith("NSADIAG")}
            os.execve(sys.executable, [sys.executable, "-c",
                      "import os, sys, time\\n"
                      "open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
                      "while True: time.sleep(0.2)", pid_file], env)
        os._exit(0)
    os.wait()
    while not os.path.exists(pid_file):
        time.sleep(0.05)
    print("helper started", flush=True)
""")


@pytest.mark.parametrize("delay", [0.0, 1.0])
def test_a_helper_that_drops_the_token_and_double_forks_is_gone_after_ok(tmp_path, delay):
    script = tmp_path / "helper.py"
    script.write_text(STRIPPING_HELPER)
    pid_file = tmp_path / "helper.pid"
    done = nsadiag("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(script),
                   str(delay), str(pid_file), env=checkout_env())
    helper = int(pid_file.read_text())
    try:
        assert done.returncode == 0, done.stderr
        assert json.loads((tmp_path / "run" / "summary.json").read_text())["verdict"] == "OK"
        assert "helper started" in done.stdout
        gone = psutil.wait_procs([psutil.Process(helper)], timeout=5)[0] \
            if psutil.pid_exists(helper) else True
        assert gone, f"the helper (pid {helper}) outlived the OK verdict"
    finally:
        if psutil.pid_exists(helper):
            os.kill(helper, signal.SIGKILL)


# ---- a full disk ----------------------------------------------------------------------------


def test_a_copy_that_cannot_be_written_never_stops_the_output(tmp_path, monkeypatch):
    kept = tmp_path / "stdout.txt"
    kept.symlink_to("/dev/full")  # a file whose every write fails, as on a full disk
    monkeypatch.setattr(runcmd, "create_file", lambda path: open("/dev/full", "wb",
                                                                 buffering=0), raising=False)
    read, write = os.pipe()
    terminal = tmp_path / "terminal.txt"
    shown = open(terminal, "wb")
    echo = Echo([shown.fileno()])
    tee = runcmd._Tee(read, echo, 0, kept)  # the read end of the pipe, as the command has it
    tee.start()
    data = b"".join(b"line %d\n" % i for i in range(200_000))  # > a pipe's buffer

    def command_writes() -> None:  # blocks for good if the copy stops draining the pipe
        with os.fdopen(write, "wb") as pipe:
            pipe.write(data)

    command = threading.Thread(target=command_writes, daemon=True)
    command.start()
    command.join(timeout=60)
    assert not command.is_alive(), "the command's output was not drained"
    tee.join(timeout=60)
    assert not tee.is_alive()
    echo.finish()
    shown.close()
    assert terminal.read_bytes() == data
    assert "No space left on device" in tee.lost


FILL = textwrap.dedent("""
    import sys
    line = "x" * 1023 + "\\n"
    for _ in range(24 * 1024):  # 24 MiB to the output, a disk of 16
        sys.stdout.write(line)
    sys.stdout.flush()
    print("filled", file=sys.stderr, flush=True)
""")


def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs "
                            "/mnt 2>/dev/null"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs a private mount namespace "
                    "(unshare -m) to make a small full disk")
def test_a_full_disk_stops_the_copies_but_the_verdict_and_report_are_written(tmp_path):
    (tmp_path / "fill.py").write_text(FILL)
    disk = tmp_path / "disk"
    disk.mkdir()
    command = (f"mount -t tmpfs -o size=16m tmpfs {disk} && cd {REPO} && "
               f"{sys.executable} -m nsadiag.cli run --out {disk}/run -- {sys.executable} "
               f"{tmp_path}/fill.py > {tmp_path}/terminal.txt 2> {tmp_path}/stderr.txt; "
               f"echo $? > {tmp_path}/rc.txt; cp -r {disk}/run {tmp_path}/kept")
    subprocess.run(["unshare", "-m", "sh", "-c", command], timeout=300, check=True)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert (tmp_path / "rc.txt").read_text().strip() == "0", stderr
    assert "Traceback" not in stderr
    assert (tmp_path / "terminal.txt").read_text().count("x" * 1023) == 24 * 1024
    kept = tmp_path / "kept"
    assert json.loads((kept / "summary.json").read_text())["verdict"] == "OK"
    assert "# nsadiag run: ✅ OK" in (kept / "report.md").read_text()
    copies = json.loads((kept / "record.json").read_text())["evidence"]["output_copies"]
    assert copies[0].startswith("stdout.txt: the copy stopped after ")
    assert "No space left on device" in copies[0]
    assert "nsadiag run: stdout.txt: the copy stopped after" in stderr


# ---- a reused --out -------------------------------------------------------------------------


def test_a_stopped_rerun_on_a_reused_out_keeps_what_it_found_in_place_of_the_earlier(
        tmp_path):
    out = tmp_path / "run"
    first = nsadiag("run", "--out", str(out), "--", sys.executable, "-c", "print('first')",
                    env=checkout_env())
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()
              if p.is_file() and p.name != ".nsadiag.lock"}
    second = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", "--out", str(out),
                               "--", sys.executable, "-c",
                               "import time; print('second', flush=True); time.sleep(120)"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_for(lambda: (out / "stdout.txt").exists() and
                  "second" in (out / "stdout.txt").read_text(), 120, "the second run")
        # while it runs, the directory holds the new run only: no earlier verdict beside it
        assert not (out / "report.md").exists() and not (out / "record.json").exists()
        second.send_signal(signal.SIGTERM)
        _, err = second.communicate(timeout=120)
    finally:
        second.kill()
    assert second.returncode == 143, err
    # the interrupted run is recorded whole, in place of the first: nothing of both
    assert (out / "stdout.txt").read_bytes() != before["stdout.txt"]
    assert "interrupted by SIGTERM" in (out / "report.md").read_text()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert not list(out.glob(".nsadiag-earlier-*"))
    rendered = nsadiag("report", str(out), env=checkout_env())
    assert rendered.returncode == 0, rendered.stderr
    assert "time.sleep(120)" in json.loads((out / "summary.json").read_text())["argv"][-1]


def test_a_finished_rerun_replaces_the_earlier_run_whole(tmp_path):
    out = tmp_path / "run"
    assert nsadiag("run", "--out", str(out), "--", sys.executable, "-c",
                   "print('first')", env=checkout_env()).returncode == 0
    first_procs = {p.name for p in out.glob("proc-*")}
    done = nsadiag("run", "--out", str(out), "--", sys.executable, "-c", "print('second')",
                   env=checkout_env())
    assert done.returncode == 0, done.stderr
    assert (out / "stdout.txt").read_text() == "second\n"
    assert not first_procs & {p.name for p in out.glob("proc-*")}
    assert json.loads((out / "summary.json").read_text())["argv"][-1] == "print('second')"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert not list(out.glob(".nsadiag-earlier-*"))


# ---- a command that cannot start ------------------------------------------------------------


@pytest.mark.parametrize("kind, message", [
    ("empty", "command: the program to run is an empty word"),
    ("directory", "is a directory, not a program"),
    ("not executable", "is not executable (chmod +x"),
])
def test_a_command_that_cannot_start_is_one_clear_line_and_leaves_no_run_dir(
        tmp_path, kind, message):
    (tmp_path / "adir").mkdir()
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "train.py").chmod(0o644)
    word = {"empty": "", "directory": str(tmp_path / "adir"),
            "not executable": str(tmp_path / "train.py")}[kind]
    done = nsadiag("run", "--", word, cwd=tmp_path, env=checkout_env())
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr
    assert "Permission denied" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "train.py"]


# ---- a stop during start-up -----------------------------------------------------------------

SLOW_START = textwrap.dedent("""
    import os, sys, time
    MARK = os.environ.get("NSADIAG_TEST_SLOW_START")
    def hook(event, args):
        # nsadiag is starting: it imports typer to build its command line
        if event == "import" and args[0] == "typer" and MARK and not os.path.exists(MARK):
            open(MARK, "w").close()
            time.sleep(120)
    sys.addaudithook(hook)
""")


def test_sigterm_while_nsadiag_starts_is_one_line_and_exit_143(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SLOW_START)
    mark = tmp_path / "importing"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}",
           "NSADIAG_TEST_SLOW_START": str(mark)}
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "--version"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark.exists, 120, "nsadiag to start importing its command line")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, (proc.returncode, err)
    assert err == "nsadiag: interrupted while starting; nothing was run\n"


# ---- a deadline shorter than the start-up ---------------------------------------------------


def test_a_deadline_before_the_first_heartbeat_is_slow_not_deadlock(tmp_path):
    # the command's Python starts only after a second: no heartbeat can come before then
    done = nsadiag("run", "--deadline", "0.3", "--out", str(tmp_path / "run"), "--", "sh",
                   "-c", f"sleep 1; exec {sys.executable} -c pass", env=checkout_env())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["verdict"] == "SLOW", done.stdout + done.stderr
    assert "before the first heartbeat: the process was still starting" in \
        summary["finding"]["proof"]
