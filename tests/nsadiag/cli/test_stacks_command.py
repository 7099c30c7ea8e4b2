"""nsadiag stacks on live processes: one waiting process, and ranks under a launcher with
one rank doing something else."""

import json
import subprocess
import sys

from nsadiag.verdict.thresholds import IDLE_CPU_FRACTION
from tests.helpers import nsadiag
from tests.procs import blocked, kill_tree, wait_for

LAUNCHER = r"""
import os, subprocess, sys, time
# each rank writes its pid into READY/rank-R just before it waits or spins
READY = "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"
WAIT = READY + "import threading\nlock = threading.Lock()\nlock.acquire()\nlock.acquire()\n"
SPIN = READY + "def spin():\n    while True:\n        pass\nspin()\n"
procs = [subprocess.Popen([sys.executable, "-c", SPIN if rank == 2 else WAIT,
                           os.path.join(sys.argv[1], f"rank-{rank}")],
                          env={**os.environ, "RANK": str(rank)}) for rank in range(3)]
time.sleep(600)
"""


def test_ranks_are_clustered_and_the_odd_rank_is_named(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)])
    ready = [tmp_path / f"rank-{rank}" for rank in range(3)]
    try:
        wait_for(lambda: all(path.exists() and path.read_text() for path in ready), 60,
                 "the three ranks to start")
        waiting = [blocked(int(path.read_text())) for path in ready[:2]]
        wait_for(lambda: all([rank_waits() for rank_waits in waiting]), 60,
                 "ranks 0 and 1 to wait on their lock")
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
    # how much of a core the spin gets depends on the machine's load (28 % beside five
    # burners on two cores): it is busy by the idle bar, and busier than the waiting ranks
    spun, waited = by_rank[2]["cpu_fraction"], (by_rank[0]["cpu_fraction"],
                                                 by_rank[1]["cpu_fraction"])
    assert spun >= IDLE_CPU_FRACTION and spun > max(waited)
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
        wait_for(blocked(proc.pid, threads=2), 60,
                 "the loader to wait on the lock and the main thread to sleep")
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
    # decided once by the command and kept in stacks.json; the report lays it out
    kept = json.loads((tmp_path / "run" / "stacks.json").read_text())["finding"]
    assert kept["headline"] == summary["headline"] and kept["command"] == "stacks"
    assert any(line.startswith("report: ") and line.endswith("/run/report.md")
               for line in lines)
