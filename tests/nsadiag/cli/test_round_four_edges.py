"""Round four's smaller edges: a file that is no program is one line; attach and stacks
refuse what is not Python (a shell, a kernel thread) before anything is written; attach
takes its duration as an argument; stacks samples the Python processes under a PID; and
compare of two `nsadiag run` directories compares their verdicts, step times and peak
memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import checkout_env, nsadiag


def test_a_file_that_is_no_program_is_one_line_and_nothing_else(tmp_path):
    data = tmp_path / "notes.txt"
    data.write_text("just text\n")
    data.chmod(0o755)
    done = nsadiag("run", "--out", str(tmp_path / "run"), "--", str(data))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("nsadiag: error: command: '") and line.endswith(
        "notes.txt' is not a program: it has no #! line and is not an executable binary; "
        "run it with the program it is for"), line
    assert not (tmp_path / "run").exists()


@pytest.fixture
def shell():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("command", ["attach", "stacks"])
def test_a_process_that_is_not_python_is_refused_at_once(tmp_path, shell, command):
    out = tmp_path / "run"
    done = nsadiag(command, str(shell.pid), "--out", str(out))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()[-1:]
    assert f"pid: process {shell.pid} (sleep) is not a Python process" in line
    assert not out.exists()


def test_stacks_refuses_a_kernel_thread(tmp_path):
    done = nsadiag("stacks", "2", "--out", str(tmp_path / "run"))
    assert done.returncode == 2, done.stderr
    assert "pid: process 2 (a kernel thread) is not a Python process" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.fixture
def python_with_children(tmp_path):
    script = tmp_path / "pool.py"
    script.write_text("import multiprocessing as mp, time\n"
                      "def work(_):\n    time.sleep(120)\n"
                      "if __name__ == '__main__':\n"
                      "    with mp.Pool(2) as pool:\n        pool.map(work, range(2))\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while len(psutil.Process(proc.pid).children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    yield proc
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_stacks_samples_the_python_processes_under_the_pid(tmp_path, python_with_children):
    out = tmp_path / "run"
    done = nsadiag("stacks", str(python_with_children.pid), "--samples", "1", "--out",
                   str(out), "--json")
    assert done.returncode == 0, done.stderr
    sampled = json.loads((out / "stacks.json").read_text())["processes"]
    assert len(sampled) == 3 and sampled[0]["pid"] == python_with_children.pid


def test_attach_takes_its_duration_as_an_argument(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        done = nsadiag("attach", str(proc.pid), "2", "--out", str(tmp_path / "run"))
        assert done.returncode in (0, 1), done.stderr
        meta = json.loads((tmp_path / "run" / "run.json").read_text())
        assert meta["duration_s"] == 2.0
        twice = nsadiag("attach", str(proc.pid), "2", "--duration", "3")
        assert twice.returncode == 2 and "duration: given twice" in twice.stderr
    finally:
        proc.kill()
        proc.wait()


LOOP = ("import sys, time, torch\n"
        "m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), 0.1)\n"
        "end = time.time() + float(sys.argv[1])\n"
        "while time.time() < end:\n"
        "    loss = m(torch.randn(4, 8)).pow(2).mean(); opt.zero_grad(); loss.backward()\n"
        "    opt.step(); time.sleep(float(sys.argv[2]))\n")


def test_compare_of_two_runs_compares_verdict_step_time_and_peak_memory(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    env = checkout_env()
    fast = nsadiag("run", "--out", str(tmp_path / "fast"), "--", sys.executable, str(script),
                   "2", "0", env=env)
    assert fast.returncode == 0, fast.stderr
    # the deadline counts from the start: on a loaded machine torch's import alone can take
    # several seconds, and a run stopped before its first step has no step time to compare
    slow = nsadiag("run", "--deadline", "12", "--out", str(tmp_path / "slow"), "--",
                   sys.executable, str(script), "60", "0.02", env=env)
    assert slow.returncode == 1, slow.stderr
    same = nsadiag("compare", str(tmp_path / "fast"), str(tmp_path / "fast"), "--json")
    assert same.returncode == 0, same.stderr
    result = json.loads(same.stdout)
    assert {d["quantity"] for d in result["deltas"]} == {"step_s", "peak_rss"}
    refused = nsadiag("compare", str(tmp_path / "fast"), str(tmp_path / "slow"))
    assert refused.returncode == 2 and "configurations differ" in refused.stderr
    forced = nsadiag("compare", str(tmp_path / "fast"), str(tmp_path / "slow"), "--force",
                     "--json")
    assert forced.returncode == 3, forced.stderr
    result = json.loads(forced.stdout)
    assert result["verdict_changes"] == [{"label": "the command", "n_layers": 0,
                                          "before": "OK", "after": "SLOW",
                                          "failure_now": True}]
    (step,) = [d for d in result["deltas"] if d["quantity"] == "step_s"]
    assert step["after"] > step["before"] and step["regressed"]
