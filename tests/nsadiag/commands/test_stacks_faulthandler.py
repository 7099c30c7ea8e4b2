"""The capture ladder's last rung: faulthandler dumps (SIGUSR1) when py-spy is missing or
refused — only for processes that registered the handler and whose dump file is known."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from nsadiag.commands.stacks import stacks_command
from nsadiag.evidence import StackSample
from nsadiag.probes import stacks
from nsadiag.probes.frames import classify, wait_frame
from nsadiag.probes.stacks import capture, catches_sigusr1, parse_faulthandler, trial_dump_file
from nsadiag.report.dispatch import render_run
from nsadiag.spec import JobSpec, TrialSpec
from tests.helpers import REPO, STACK_FIXTURES
from tests.procs import blocked, wait_for

DUMP = """\
Thread 0x00007f1e8b7fe640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/work/data.py", line 12 in loader
  File "/usr/lib/python3.11/threading.py", line 995 in _bootstrap

Current thread 0x00007f1e9c3b1740 (most recent call first):
  File "/work/model.py", line 16 in hold_twice
  File "/work/model.py", line 19 in <module>
"""


def test_parser_reads_every_thread_innermost_first():
    sample = parse_faulthandler(DUMP, pid=7, cpu_seconds=1.5, t=10.0)
    assert (sample.pid, sample.cpu_seconds, sample.t, sample.native) == (7, 1.5, 10.0, False)
    worker, main = sample.threads
    assert worker.thread_id == 0x7F1E8B7FE640 and worker.name is None
    assert [(f.function, f.line) for f in worker.frames] == [("wait", 320), ("loader", 12),
                                                             ("_bootstrap", 995)]
    assert main.name == "MainThread"  # its outermost frame is the module's top level
    assert [(f.function, f.file, f.is_native) for f in main.frames] == [
        ("hold_twice", "/work/model.py", False), ("<module>", "/work/model.py", False)]


def test_parser_refuses_text_without_a_thread():
    try:
        parse_faulthandler("Fatal Python error: nothing\n", pid=1, cpu_seconds=None)
    except ValueError as err:
        assert "no thread" in str(err)
    else:
        raise AssertionError("no ValueError")


def _start(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(STACK_FIXTURES / "faulthandler_child.py"),
                             *args], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


def test_without_py_spy_a_registered_child_is_sampled_by_faulthandler(monkeypatch, tmp_path):
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
    dump = tmp_path / "faulthandler.txt"
    proc = _start(str(dump))
    try:
        assert catches_sigusr1(proc.pid)
        taken = []
        for _ in range(3):
            taken.append(capture(proc.pid, native=True, faulthandler_file=dump))
            time.sleep(0.2)
        alive = proc.poll() is None
    finally:
        _stop(proc)
    assert alive
    assert all(isinstance(s, StackSample) for s in taken), taken
    assert taken[0].note == ("stacks from faulthandler: py-spy: not found beside the "
                             "interpreter or on PATH")
    top = taken[-1].threads[0].frames[0]
    assert (top.function, top.line, top.code) == ("hold_twice", 23, "lock.acquire()")
    assert wait_frame(taken[-1].threads[0]) == top
    assert classify(taken) == "waiting"
    assert dump.read_text().count("most recent call first") == 3  # one dump per sample


def test_a_process_without_the_handler_is_not_signalled(monkeypatch, tmp_path):
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
    proc = _start()
    try:
        assert not catches_sigusr1(proc.pid)
        reason = capture(proc.pid, faulthandler_file=tmp_path / "faulthandler.txt")
        time.sleep(0.2)
        alive = proc.poll() is None
    finally:
        _stop(proc)
    assert alive  # SIGUSR1's default action would have killed it
    assert reason == ("py-spy: not found beside the interpreter or on PATH; faulthandler "
                      "fallback not possible: the process did not register SIGUSR1")
    assert not (tmp_path / "faulthandler.txt").exists()


def test_stacks_command_falls_back_for_a_trial_child_when_ptrace_is_refused(
        monkeypatch, tmp_path):
    """A real deadlocked trial child: its dump file is found from its job."""
    import nsadiag.commands.stacks as command

    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
    monkeypatch.setattr(command, "ptrace_permission", lambda: "refused (ptrace_scope=3)")
    trial_dir = tmp_path / "trial"
    spec = TrialSpec(target="repro.lock_deadlock:make", n_layers=1, seq_len=16, steps=1,
                     out_dir=str(trial_dir))
    spec_path = tmp_path / "job.json"
    spec_path.write_text(JobSpec("trial", spec).to_json())
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.harness.child", str(spec_path)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        events = trial_dir / "events.jsonl"
        wait_for(lambda: events.exists() and '"phase":"backward"' in events.read_text(), 120,
                 "the trial's backward")
        wait_for(blocked(proc.pid), 60, "the backward hook to wait for the lock")
        assert trial_dump_file(proc.pid) == trial_dir / "faulthandler.txt"
        summary = stacks_command(proc.pid, ranks=False, count=3, interval_s=0.3, native=False)
        alive = proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert alive
    (report,) = summary["processes"]
    assert report["state"] == "waiting" and report["unavailable"] == []
    frames = [f["function"] for t in report["samples"][-1]["threads"] for f in t["frames"]]
    assert "_wait_for_lock" in frames
    out = tmp_path / "out"
    out.mkdir()
    (out / "stacks.json").write_text(json.dumps(summary))
    (out / "run.json").write_text(json.dumps({"command_name": "stacks", "argv": []}))
    md = render_run(out).report.read_text()
    assert md.startswith("# nsadiag stacks: ✅ MEASURED (measured): waiting (1 process(es))\n")
    assert f"| {proc.pid} | - | **waiting** |" in md
    assert "- note: stacks from faulthandler: py-spy: not found" in md
    assert "_wait_for_lock (lock_deadlock.py:" in md
    stored = json.loads((tmp_path / "out" / "stacks.json").read_text())
    assert stored["processes"][0]["state"] == "waiting"


def test_stacks_command_refuses_when_ptrace_is_refused_and_no_fallback(monkeypatch):
    import nsadiag.commands.stacks as command

    monkeypatch.setattr(command, "ptrace_permission", lambda: "refused (ptrace_scope=3)")
    proc = _start()
    try:
        stacks_command(proc.pid, ranks=False, count=1, interval_s=0.0, native=False)
    except ValueError as err:
        message = str(err)
    else:
        message = ""
    finally:
        alive = proc.poll() is None
        _stop(proc)
    assert alive
    assert message == ("ptrace: refused (ptrace_scope=3); faulthandler fallback not "
                       "possible: the process did not register SIGUSR1")
