"""A cancelled nsadiag (SIGTERM from CI or `timeout`) kills its trial children on the way out."""

import signal
import subprocess
import sys
import time

import psutil


def test_sigterm_to_nsadiag_leaves_no_trial_child(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsadiag.cli", "sweep-layers", "--target",
         "repro.lock_deadlock:make", "--layers", "1", "--seq-len", "64", "--stall-timeout",
         "120", "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 90
    children = []
    while time.monotonic() < deadline and not children:
        children = [c for c in parent.children(recursive=True)
                    if "nsadiag.harness.child" in " ".join(c.cmdline())]
        time.sleep(0.2)
    assert children, "the trial child never started"
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.pid for p in alive]
