"""A cancelled nsadiag (SIGTERM from CI or `timeout`) kills its trial children on the way out."""

import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from nsadiag.harness import jobs, stop
from nsadiag.spec import TrialSpec
from tests.procs import descendants, wait_for


def test_sigterm_to_nsadiag_leaves_no_trial_child(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsadiag.cli", "sweep-layers", "--target",
         "repro.lock_deadlock:make", "--layers", "1", "--seq-len", "64", "--stall-timeout",
         "120", "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    children = wait_for(lambda: descendants(proc.pid, "nsadiag.harness.child"), 90,
                        "the trial child")
    events = tmp_path / "run" / "trial-0" / "events.jsonl"
    wait_for(lambda: events.exists() and events.read_text(), 90, "the trial's heartbeat")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err  # 128 + SIGTERM, as a shell reports it
    assert "Traceback" not in err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.pid for p in alive]


def test_a_swallowed_interrupt_still_stops_the_trial(tmp_path, monkeypatch):
    """The signal handler's KeyboardInterrupt can be lost (raised inside an import that C
    code makes and whose errors it clears, as torch does with numpy); the stop it requested
    is not: the watch loop raises again on its next poll, and no trial child is left."""
    monkeypatch.setattr(stop, "_requested", threading.Event())
    launched = []

    def remember(*args, **kwargs):
        launched.append(jobs_launched(*args, **kwargs))
        return launched[-1]

    jobs_launched = jobs.Launched
    monkeypatch.setattr(jobs, "Launched", remember)

    def request_once_running():
        events = tmp_path / "trial" / "events.jsonl"
        try:
            wait_for(lambda: launched and launched[0].proc.poll() is None, 90, "the trial child")
            wait_for(lambda: events.exists() and events.read_text(), 90, "its heartbeat")
        finally:
            stop.request()  # what the handler does; its own raise is taken as lost

    requester = threading.Thread(target=request_once_running, daemon=True)
    requester.start()
    spec = TrialSpec(target="repro.lock_deadlock:make", n_layers=1, seq_len=64,
                     stall_timeout_s=120.0, out_dir=str(tmp_path / "trial")).validate()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        jobs.run_trial(spec)
    assert time.monotonic() - started < 60, "the stop waited for the stall timeout"
    requester.join(timeout=5)
    child = psutil.Process(launched[0].pid) if psutil.pid_exists(launched[0].pid) else None
    assert child is None or child.status() == psutil.STATUS_ZOMBIE


INTERRUPTED_IN_EXEC = """
import os, signal, sys, threading
import nsadiag.cli.app

cli = sys.modules["nsadiag.cli.app"]  # the package's `app` attribute is the typer app

def run(args=None):
    # the SIGTERM lands while source text runs under exec, as when an import builds a
    # dataclass; the interrupt is handled, and the command decides on exit 130
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        exec("import time\\nfor _ in range(400): time.sleep(0.05)\\n", {})
    except KeyboardInterrupt:
        return 130
    return 0

cli.run = run
cli.main()
"""


def test_an_interrupt_that_landed_in_exec_still_exits_130(tmp_path):
    """CPython ends a process by SIGINT, whatever its exit code, once a KeyboardInterrupt
    has left exec'd source text (even one caught later); nsadiag's documented code for an
    interrupted command is 130 all the same."""
    (tmp_path / "interrupted_cli.py").write_text(INTERRUPTED_IN_EXEC)
    proc = subprocess.run([sys.executable, "-m", "interrupted_cli"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
