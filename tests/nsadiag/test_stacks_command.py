"""nsadiag stacks on live processes: one waiting process, and ranks under a launcher with
one rank doing something else."""

import json
import subprocess
import sys
import time

import psutil

from tests.helpers import nsadiag
from tests.procs import kill_tree

LAUNCHER = r"""
import os, subprocess, sys, time
WAIT = "import threading\nlock = threading.Lock()\nlock.acquire()\nlock.acquire()\n"
SPIN = "def spin():\n    while True:\n        pass\nspin()\n"
procs = [subprocess.Popen([sys.executable, "-c", SPIN if rank == 2 else WAIT],
                          env={**os.environ, "RANK": str(rank)}) for rank in range(3)]
time.sleep(600)
"""


def test_ranks_are_clustered_and_the_odd_rank_is_named():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER])
    try:
        deadline = time.time() + 30
        while len(psutil.Process(launcher.pid).children()) < 3 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # let the children reach their lock or loop
        done = nsadiag("stacks", str(launcher.pid), "--ranks", "--samples", "3",
                       "--interval", "0.3", "--json")
    finally:
        kill_tree(launcher)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    by_rank = {p["rank"]: p for p in summary["processes"]}
    assert sorted(by_rank) == [0, 1, 2]
    assert by_rank[0]["state"] == by_rank[1]["state"] == "waiting"
    # a one-line spin can look like a native op (same innermost frame, CPU rising): busy either way
    assert by_rank[2]["state"] in ("busy-python", "busy-native")
    assert by_rank[2]["cpu_fraction"] > 0.3
    assert summary["odd_ones_out"] == [by_rank[2]["pid"]]
    assert any(c["members"] == [0, 1] for c in summary["clusters"])


def test_missing_process_is_one_line_exit_2():
    done = nsadiag("stacks", "999999999")
    assert done.returncode == 2
    assert done.stderr.strip() == "nsadiag: error: pid: no process 999999999"


def test_bad_sample_count_is_one_line_exit_2():
    done = nsadiag("stacks", "1", "--samples", "0")
    assert done.returncode == 2 and "samples: must be >= 1" in done.stderr


BLOCKED = """import threading, time
lock = threading.Lock()
lock.acquire()


def load_batches():
    lock.acquire()  # blocks for ever: the main thread never releases it


threading.Thread(target=load_batches, name="loader", daemon=True).start()
time.sleep(600)
"""


def test_the_console_shows_a_thread_blocked_on_a_lock(tmp_path):
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(1.5)
        done = nsadiag("stacks", str(proc.pid), "--samples", "2", "--interval", "0.3",
                       "--out", str(tmp_path / "run"))
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    loader = next(i for i, line in enumerate(lines) if "thread loader" in line)
    assert "waiting in load_batches (blocked.py:7)" in lines[loader]
    assert "load_batches (blocked.py:7)" in lines[loader + 1]
    assert any("thread MainThread" in line for line in lines)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (process,) = summary["processes"]
    assert {t["name"] for t in process["threads"]} == {"MainThread", "loader"}
    assert any(line.startswith("report: ") and line.endswith("/run/report.md")
               for line in lines)
