"""nsadiag attach: a live process (or every rank under torchrun) watched for a window and
left running: progressing, stuck (busy or idle) or waiting in a collective, with the run
directory's report.md, summary.json and run.json."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nsadiag.evidence import Evidence
from nsadiag.harness.runcmd import command_env
from nsadiag.verdict import decide
from nsadiag.verdict.window import judge_window
from tests.helpers import SCRIPTS, VERDICT_FIXTURES, nsadiag
from tests.procs import blocked, descendants, kill_tree, wait_for

TRAINING = textwrap.dedent("""
    import torch
    from torch import nn
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10**9):
        model(torch.randn(64, 64)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 5:
            print("training", flush=True)
""")
LOCKED = textwrap.dedent("""
    import threading
    lock = threading.Lock()
    lock.acquire()
    print("training", flush=True)
    lock.acquire()  # waits for itself
""")
LOCKED_WITH_A_TICKER = textwrap.dedent("""
    import threading
    import time

    def tick():  # a progress-bar thread: it wakes ten times a second, forever
        while True:
            time.sleep(0.1)

    threading.Thread(target=tick, daemon=True).start()
    lock = threading.Lock()
    lock.acquire()
    print("training", flush=True)
    lock.acquire()  # waits for itself
""")
SPIN = textwrap.dedent("""
    import time
    ready = False
    print("training", flush=True)
    while not ready:  # a spin over three lines: its stacks move, it never progresses
        time.sleep(0)
        ready = False
""")


def wait_for_idle_pulses(run_dir: Path, count: int, timeout_s: float) -> None:
    """Until the last `count` pulses of the heartbeat under run_dir report no progress."""
    def idle() -> bool:
        pulses = [event for path in run_dir.glob("proc-*/events.jsonl")
                  for line in path.read_text().splitlines()[:-1]  # the last may be torn
                  for event in [json.loads(line)] if event.get("kind") == "pulse"]
        return len(pulses) >= count and not any(p["progress"] for p in pulses[-count:])

    wait_for(idle, timeout_s, f"{count} idle pulses in a row under {run_dir}", every_s=0.5)


def start(tmp_path: Path, code: str, env: dict | None = None) -> subprocess.Popen:
    """The target script `code` in a session of its own, once it printed "training"."""
    script = tmp_path / "target.py"
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    assert proc.stdout.readline().strip() == "training"
    return proc


def attach(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "attach"
    done = nsadiag("attach", *args, "--out", str(out))
    summary = out / "summary.json"
    return done, json.loads(summary.read_text()) if summary.exists() else None


@pytest.mark.parametrize("name", ["deadlock_lock.json", "busy_matmul.json",
                                  "collective_all_reduce.json"])
def test_a_window_reads_a_stall_as_a_watched_runs_rules_do(name):
    # the same stall evidence judged over an attach window and at a watched run's stall
    # timeout: one classification, the window stating no heartbeat position
    fixture = VERDICT_FIXTURES / name
    evidence = Evidence.from_dict(json.loads(fixture.read_text()))
    watched = decide(evidence)
    window = judge_window(evidence.stall, None, evidence.stall.window_s)
    assert window.name == watched.name
    assert window.reasons == [r for r in watched.reasons if not r.startswith("last heartbeat")]
    assert window.facts.position.state in ("stuck (idle)", "stuck (busy)",
                                           "waiting in a collective")


def test_a_training_loop_is_progressing_and_left_running(tmp_path):
    proc = start(tmp_path, TRAINING)
    try:
        done, summary = attach(tmp_path, str(proc.pid), "--duration", "3")
        assert done.returncode == 0, done.stderr
        assert summary["verdict"] == "OK" and summary["state"] == "progressing"
        assert "its Python stacks changed between samples" in summary["finding"]["proof"]
        assert summary["finding"]["kind"] == "healthy" and summary["finding"]["culprit"] is None
        assert proc.poll() is None, "attach must not stop the process"
        meta = json.loads((tmp_path / "attach" / "run.json").read_text())
        assert meta["command_name"] == "attach" and meta["pid"] == proc.pid
        assert (tmp_path / "attach" / "report.md").read_text().startswith(
            "# nsadiag attach: ✅ OK (healthy)")
        # decided once by the command and kept in attach.json; the report lays it out
        kept = json.loads((tmp_path / "attach" / "attach.json").read_text())["finding"]
        assert kept["headline"] == summary["headline"] and kept["kind"] == "healthy"
    finally:
        kill_tree(proc)


def test_a_process_waiting_on_a_lock_is_stuck_idle_naming_the_line(tmp_path):
    proc = start(tmp_path, LOCKED)
    try:
        wait_for(blocked(proc.pid), 60, "the target to wait on its lock")
        done, summary = attach(tmp_path, str(proc.pid), "--duration", "3")
        assert done.returncode == 1, done.stderr
        assert summary["verdict"] == "DEADLOCK" and summary["state"] == "stuck (idle)"
        record = json.loads((tmp_path / "attach" / "attach.json").read_text())
        facts = record["verdict"]["facts"]
        assert facts["wait_frame"].startswith("<module> (target.py:")
        assert proc.poll() is None
    finally:
        kill_tree(proc)


def test_a_true_deadlock_beside_moving_threads_is_stuck_idle_with_high_confidence(tmp_path):
    """A process under nsadiag's heartbeat (its sampler thread moves) with a thread of its
    own that wakes all the time: the window's nonblocking samples and the native ones
    taken at its end show the same frozen main thread, a deadlock, not a polling wait."""
    (tmp_path / "run").mkdir()
    proc = start(tmp_path, LOCKED_WITH_A_TICKER, env=command_env(tmp_path / "run"))
    try:
        wait_for_idle_pulses(tmp_path / "run", count=2, timeout_s=60.0)
        done, summary = attach(tmp_path, str(proc.pid), "--duration", "3")
        assert done.returncode == 1, done.stderr
        assert summary["verdict"] == "DEADLOCK", summary["headline"]
        record = json.loads((tmp_path / "attach" / "attach.json").read_text())
        verdict = record["verdict"]
        assert verdict["facts"]["confidence"] == "high", verdict["reasons"]
        assert not any("lower confidence" in reason for reason in verdict["reasons"])
        assert verdict["facts"]["wait_frame"].startswith("<module> (target.py:")
        report = (tmp_path / "attach" / "report.md").read_text()
        assert "sampler.py" not in report.split("## Processes")[0]
    finally:
        kill_tree(proc)


def test_a_spin_under_nsadiags_heartbeat_is_stuck_busy(tmp_path):
    """Its stacks move, so stacks alone would read as progress; the heartbeat nsadiag
    injected (as under `nsadiag run`) says no progress."""
    (tmp_path / "run").mkdir()
    proc = start(tmp_path, SPIN, env=command_env(tmp_path / "run"))
    try:
        # the sampler has seen every state of the spin once two pulses in a row say no
        # progress (on a loaded machine that takes longer than on a quiet one)
        wait_for_idle_pulses(tmp_path / "run", count=2, timeout_s=60.0)
        done, summary = attach(tmp_path, str(proc.pid), "--duration", "4")
        assert done.returncode == 1, done.stderr
        assert summary["verdict"] == "STALL-BUSY", summary["headline"]
        assert summary["failing"]["reasons"][0].startswith(
            "its nsadiag heartbeat recorded no progress in the 4 s window")
        finding = summary["finding"]
        assert finding["kind"] == "stuck" and "target.py:" in finding["culprit"]["where"]
        assert proc.poll() is None
    finally:
        kill_tree(proc)


def _wait_for_output(proc: subprocess.Popen, wanted: set[tuple[str, str]],
                     timeout_s: float) -> None:
    """Read proc's stdout until every (rank, step) of `wanted` printed "rank R step N".
    Two ranks share the pipe, so their lines may interleave: match anywhere in the stream,
    and give up after timeout_s instead of blocking on a job that hung early."""
    deadline, stream, seen = time.monotonic() + timeout_s, "", set()
    while not wanted <= seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no 'rank R step N' lines for {sorted(wanted - seen)} in " \
                              f"{timeout_s:.0f} s; output so far: {stream[-500:]!r}"
        ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
        if not ready:
            continue
        chunk = os.read(proc.stdout.fileno(), 4096)
        assert chunk, f"the job ended before it hung; output: {stream[-500:]!r}"
        stream += chunk.decode(errors="replace")
        seen = set(re.findall(r"rank (\d+) step (\d+)", stream))


def test_ranks_of_a_torchrun_job_waiting_in_collectives(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc_per_node", "2", str(SCRIPTS / "ddp_extra_allreduce.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        # both ranks stop at step 2
        _wait_for_output(proc, {("0", "1"), ("1", "1")}, timeout_s=180.0)
        ranks = descendants(proc.pid, "ddp_extra_allreduce.py")
        assert len(ranks) == 2, [p.cmdline() for p in ranks]
        waiting = [blocked(rank.pid) for rank in ranks]
        wait_for(lambda: all([rank_waits() for rank_waits in waiting]), 120,
                 "both ranks to wait in their collective")
        done, summary = attach(tmp_path, str(proc.pid), "--ranks", "--duration", "3")
        assert done.returncode == 1, done.stderr
        assert summary["verdict"] == "STALL-COLLECTIVE", summary["headline"]
        ranks = {p["rank"]: p for p in summary["processes"]}
        assert sorted(ranks) == [0, 1]
        assert all(p["state"] == "waiting in a collective" for p in ranks.values())
        line = next(i for i, text in enumerate((SCRIPTS / "ddp_extra_allreduce.py")
                                               .read_text().splitlines(), 1)
                    if text.strip().startswith("dist.all_reduce(overflow"))
        assert ranks[1]["user_frame"] == f"main (ddp_extra_allreduce.py:{line})"
        assert ranks[1]["collective_frame"].startswith("all_reduce (distributed_c10d.py:")
        assert "loss.backward()" in (SCRIPTS / "ddp_extra_allreduce.py").read_text() \
            .splitlines()[int(ranks[0]["user_frame"].rsplit(":", 1)[1][:-1]) - 1]
        assert proc.poll() is None
    finally:
        kill_tree(proc)


@pytest.mark.parametrize("args, message", [
    (["999999999"], "pid: no process 999999999"),
    ([str(os.getpid()), "--duration", "0"], "duration: must be >= 1 seconds, got 0"),
])
def test_usage_errors_are_one_line_exit_2(tmp_path, args, message):
    done, summary = attach(tmp_path, *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and message in done.stderr
    assert summary is None and not (tmp_path / "attach").exists()
