"""nsadiag run -- CMD: a user's own script, unchanged, watched to a verdict; its output
passes through and is kept; no process outlives the run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import psutil

from tests.helpers import block_enters, nsadiag

SCRIPT = textwrap.dedent("""
    import sys, threading, time, torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Linear(16, 16)

        def forward(self, x):
            return x + torch.tanh(self.mlp(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x.pow(2).mean()

    mode, steps = sys.argv[1], int(sys.argv[2])
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        model(torch.randn(4, 16)).backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}", flush=True)
        if mode == "crash" and step == 1:
            raise RuntimeError("the data loader returned an empty batch")
        if mode == "deadlock" and step == 1:
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()
    """)


def nsadiag_run(tmp_path, *args, options=(), timeout=200):
    """`nsadiag run OPTIONS -- python train.py ARGS` (SCRIPT as train.py); (the process,
    summary.json or None), once no process it started is left."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    done = nsadiag("run", *options, "--out", str(tmp_path / "run"), "--", sys.executable,
                   str(script), *args, timeout=timeout)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    summary_path = tmp_path / "run" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return done, summary


def test_a_script_that_finishes_is_ok_and_its_output_passes_through(tmp_path):
    done, summary = nsadiag_run(tmp_path, "ok", "3")
    assert done.returncode == 0, done.stderr
    assert summary["verdict"] == "OK" and summary["exit_code"] == 0
    assert "step 2" in done.stdout
    assert (tmp_path / "run" / "stdout.txt").read_text().splitlines() == [
        "step 0", "step 1", "step 2"]
    evidence = json.loads((tmp_path / "run" / "evidence.json").read_text())
    main = evidence["main_process"]
    process = next(p for p in evidence["processes"] if p["name"] == main)
    assert process["events"]["step"] == 3 and process["events"]["module"] >= 1
    # block events are aggregated: together they stand for every block entered
    assert block_enters(tmp_path / "run") == 3 * 2
    # nsadiag report re-renders the same report from the stored record
    report = (tmp_path / "run" / "report.md").read_text()
    (tmp_path / "run" / "report.md").unlink()
    again = subprocess.run([sys.executable, "-m", "nsadiag.cli", "report",
                            str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "run" / "report.md").read_text() == report


def test_an_exception_in_the_script_is_an_error_quoting_it(tmp_path):
    done, summary = nsadiag_run(tmp_path, "crash", "5")
    assert done.returncode == 1
    assert summary["verdict"] == "ERROR"
    finding = summary["finding"]
    assert finding["proof"] == "RuntimeError: the data loader returned an empty batch"
    assert finding["kind"] == "crashed" and finding["culprit"]["file"] == "train.py"
    assert "Traceback" in (tmp_path / "run" / "stderr.txt").read_text()


def test_a_deadlocked_script_is_a_deadlock_and_nothing_outlives_it(tmp_path):
    done, summary = nsadiag_run(tmp_path, "deadlock", "5", options=("--stall-timeout", "4"))
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "DEADLOCK", summary
    report = (tmp_path / "run" / "report.md").read_text()
    assert "lock.acquire()" in report


def test_at_the_deadline_a_progressing_script_is_slow(tmp_path):
    done, summary = nsadiag_run(tmp_path, "ok", "100000000",
                                options=("--stall-timeout", "30", "--deadline", "8"))
    assert done.returncode == 1
    assert summary["verdict"] == "SLOW", summary
    # the limits it was watched under stay in run.json once the verdict is written
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert (meta["command_name"], meta["stall_timeout_s"], meta["deadline_s"]) == \
        ("run", 30.0, 8.0)


def test_a_sitecustomize_of_the_users_own_still_runs(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    script = tmp_path / "probe.py"
    script.write_text("import os\nprint('user site ran:', os.environ.get('USER_SITE_RAN'))\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(own)}
    done = subprocess.run([sys.executable, "-m", "nsadiag.cli", "run", "--out",
                           str(tmp_path / "run"), "--", sys.executable, str(script)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "user site ran: 1" in done.stdout
    assert list((tmp_path / "run").glob("proc-*/events.jsonl")), "the process was not watched"


def test_usage_errors_are_one_line(tmp_path):
    out = ["--out", str(tmp_path / "run")]
    for command, message in (([], "command: give the command to run after --"),
                             (["--", "no-such-program-here"], "not found")):
        done = subprocess.run([sys.executable, "-m", "nsadiag.cli", "run", *out, *command],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and message in done.stderr
