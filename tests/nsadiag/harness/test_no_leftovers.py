"""Nothing outlives nsadiag (nsadiag.harness.launch, nsadiag.harness.reaper): after a
verdict every process a job started is gone, those that left its session included; after
`kill -9` of nsadiag itself, its reaper ends every child, torchrun, rank and escaped
helper within 5 s; where a cgroup can be made, a process that forks every few
milliseconds, its parent gone, in a new session and with an empty environment, is gone
after the verdict and after `kill -9` too, and elsewhere the report says containment was
best effort. One nsadiag at a time per run directory (nsadiag.rundir)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nsadiag.harness.jobs import run_trial
from nsadiag.spec import TrialSpec
from tests.diag_targets import ESCAPED_HELPER_MARKER
from tests.helpers import REPO, nsadiag
from tests.procs import descendants, owned_by, running, wait_for

GONE_WITHIN_S = 5.0


def _left_after(processes: list[psutil.Process], owner_pid: int,
                limit_s: float = GONE_WITHIN_S) -> tuple[list[int], float]:
    """Poll until every process is gone (or `limit_s`); (pids still running, seconds)."""
    started = time.monotonic()
    while True:
        left = {p.pid for p in processes if running(p)} | {p.pid for p in
                                                             owned_by(owner_pid)}
        waited = time.monotonic() - started
        if not left or waited >= limit_s:
            return sorted(left), waited
        time.sleep(0.1)


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    """nsadiag COMMAND --out tmp_path/run ARGS... (before a `--` that ends its options)."""
    return subprocess.Popen([sys.executable, "-m", "nsadiag.cli", args[0], "--out",
                             str(tmp_path / "run"), *args[1:]], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _reaper_of(owner_pid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.cmdline()[-2:] == ["nsadiag.harness.reaper", str(owner_pid)]:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _kill_9_and_count(proc: subprocess.Popen) -> tuple[list[int], float, int]:
    """SIGKILL nsadiag; (pids left after up to 5 s, seconds until none, processes seen:
    the job's and the reaper, which must end too)."""
    reaper = _reaper_of(proc.pid)
    assert len(reaper) == 1, "nsadiag has no reaper"
    seen = descendants(proc.pid) + owned_by(proc.pid) + reaper
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    left, waited = _left_after(seen, proc.pid)
    print(f"kill -9 of nsadiag: {len({p.pid for p in seen})} processes, {len(left)} left "
          f"after {waited:.2f} s")
    return left, waited, len({p.pid for p in seen})


def test_kill_9_during_a_hung_trial_leaves_nothing(tmp_path):
    proc = _start(["sweep-layers", "--target", "repro.lock_deadlock:make", "--layers", "1",
                   "--seq-len", "64", "--stall-timeout", "600"], tmp_path)
    events = tmp_path / "run" / "trial-0" / "events.jsonl"
    # the trial is hung once its backward started: the lock is taken there and never freed
    wait_for(lambda: events.exists() and '"backward"' in events.read_text(), 120,
              "the trial's backward")
    left, waited, seen = _kill_9_and_count(proc)
    assert seen >= 2, "expected the trial child and the reaper"  # child + reaper
    assert left == [], f"{left} still running {waited:.1f} s after kill -9"


def test_kill_9_during_a_ddp_trial_leaves_no_torchrun_or_rank(tmp_path):
    proc = _start(["ddp", "--target", "repro.rank_divergent:make", "--world-size", "2",
                   "--seq-len", "64", "--batch", "2", "--steps", "3", "--stall-timeout",
                   "600"], tmp_path)
    trial = tmp_path / "run" / "trial-0"
    wait_for(lambda: all((trial / f"rank-{r}" / "events.jsonl").exists() and
                          '"forward"' in (trial / f"rank-{r}" / "events.jsonl").read_text()
                          for r in (0, 1)), 180, "both ranks to train")
    ranks = descendants(proc.pid, "nsadiag.harness.child")
    assert len(ranks) >= 2, "torchrun's ranks were not found"
    left, waited, seen = _kill_9_and_count(proc)
    assert seen >= 4  # torchrun, two ranks, the reaper
    assert left == [], f"{left} still running {waited:.1f} s after kill -9"


ESCAPING_SCRIPT = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                 start_new_session=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
os.wait()
print("helpers started", flush=True)
time.sleep(600)
"""


def test_kill_9_during_a_run_leaves_no_escaped_helper(tmp_path):
    script = tmp_path / "escaping.py"
    script.write_text(ESCAPING_SCRIPT)
    proc = _start(["run", "--stall-timeout", "600", "--", sys.executable, str(script)],
                  tmp_path)
    wait_for(lambda: len(owned_by(proc.pid)) >= 3, 60, "the script and its two helpers")
    command = min((p for p in owned_by(proc.pid) if "escaping.py" in " ".join(p.cmdline())),
                  key=lambda p: p.create_time())  # its forks share its command line
    # the double fork's grandchild leaves the command's tree (nsadiag, its subreaper,
    # adopts it)
    escaped = [p for p in owned_by(proc.pid) if p.pid != command.pid and
               p not in descendants(command.pid)]
    assert escaped, "no helper left the command's tree: the test would prove nothing"
    left, waited, _ = _kill_9_and_count(proc)
    assert left == [], f"{left} still running {waited:.1f} s after kill -9"


def test_a_trial_whose_target_starts_a_helper_in_a_new_session_leaves_nothing(tmp_path):
    record = run_trial(TrialSpec(target="tests.diag_targets:escapes", seq_len=16, steps=1,
                                 stall_timeout_s=30.0, budget_s=120.0,
                                 out_dir=str(tmp_path / "trial")))
    assert record.verdict_name == "OK", record.verdict
    helpers = [p for p in psutil.process_iter() if running(p) and
               ESCAPED_HELPER_MARKER in " ".join(p.cmdline())]
    assert helpers == [], [p.pid for p in helpers]


def test_a_second_nsadiag_on_the_same_out_refuses_and_a_killed_one_does_not_block(
        tmp_path):
    first = _start(["run", "--stall-timeout", "600", "--", sys.executable, "-c",
                    "import time; time.sleep(600)"], tmp_path)
    wait_for(lambda: list((tmp_path / "run").glob("proc-*/events.jsonl")), 60,
              "the first run's command")
    second = nsadiag("run", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", "pass")
    assert second.returncode == 2, second.stderr
    assert second.stderr.count("\n") == 1
    assert f"in use by another nsadiag (pid {first.pid})" in second.stderr
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    third = nsadiag("run", "--out", str(tmp_path / "run"), "--", sys.executable, "-c", "pass")
    assert third.returncode == 0, third.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["verdict"] == "OK"


HOPPING_SCRIPT = """
import os, random, subprocess, sys, time
if sys.argv[1:] == ["hop"]:
    while True:  # every 5-20 ms a new process, its parent gone, in a session of its own
        time.sleep(random.uniform(0.005, 0.02))
        if os.fork():
            os._exit(0)
        os.setsid()
# the hopper starts with an empty environment: no NSADIAG_OWNER token to be found by
subprocess.Popen([sys.executable, __file__, "hop"], env={}, start_new_session=True)
print("hopping", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _hoppers(script: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.cmdline()[-2:] == [str(script), "hop"] and running(process):
                found.append(process)
        except psutil.Error:
            continue
    return found


def _hoppers_left(script: Path, limit_s: float = GONE_WITHIN_S) -> list[int]:
    """The hopping processes still running once none is (or after ``limit_s``)."""
    end = time.monotonic() + limit_s
    while (left := _hoppers(script)) and time.monotonic() < end:
        time.sleep(0.1)
    return [p.pid for p in left]


def _cgroups_here() -> bool:
    from nsadiag.harness.cgroup import JobGroup

    group = JobGroup.make("probe-" + str(time.monotonic_ns()))
    if group is not None:
        group.remove()
    return group is not None


needs_cgroups = pytest.mark.skipif(not _cgroups_here(),
                                   reason="no writable cgroup v2 hierarchy with cgroup.kill")


@needs_cgroups
def test_a_process_hopping_every_few_ms_does_not_outlive_the_verdict(tmp_path):
    script = tmp_path / "hopping.py"
    script.write_text(HOPPING_SCRIPT)
    done = nsadiag("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(script),
                   "2")
    assert done.returncode == 0, done.stderr
    assert _hoppers_left(script) == []
    report = (tmp_path / "run" / "report.md").read_text()
    assert "Containment: the command and every process it started ran in a cgroup" in report
    # this run's group is removed (other runs beside this test may hold groups of their own)
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    group = record["evidence"]["containment"]["group"]
    assert group.startswith("nsadiag-")
    assert not list(Path("/sys/fs/cgroup").rglob(group))


@needs_cgroups
def test_a_process_hopping_every_few_ms_does_not_outlive_kill_9(tmp_path):
    script = tmp_path / "hopping.py"
    script.write_text(HOPPING_SCRIPT)
    proc = _start(["run", "--stall-timeout", "600", "--", sys.executable, str(script), "600"],
                  tmp_path)
    wait_for(lambda: _hoppers(script), 60, "the hopping process")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _hoppers_left(script) == []


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="hides the cgroup mounts in a mount namespace of its own (root)")
def test_without_cgroups_the_report_says_containment_was_best_effort(tmp_path):
    out = tmp_path / "run"
    unmount = "for m in $(awk '$3 == \"cgroup2\" {print $2}' /proc/mounts); do umount -l $m; done"
    script = (f"{unmount}; cd {REPO} && {sys.executable} -m nsadiag.cli run --out {out} -- "
              f"{sys.executable} -c pass")
    subprocess.run(["unshare", "-m", "sh", "-c", script], timeout=300, check=True,
                   capture_output=True)
    report = (out / "report.md").read_text()
    assert "Containment was best effort (this machine has no cgroup v2 hierarchy)" in report
