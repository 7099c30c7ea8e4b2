"""A process that is stopped (state T: SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU), or held by a
tracer, is said to be stopped, with what resumes it: read from /proc on a real stopped
process, in the chain and its Next, and end to end on a script that stops itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from nsadiag.evidence import Evidence, ProcessOutcome, StallEvidence
from nsadiag.finding.next_step import chain_next
from nsadiag.probes.waits import read_waits
from nsadiag.verdict.chain import wait_chain
from nsadiag.waitfacts import ProcessWaits, Stopped, ThreadWait
from tests.helpers import checkout_env, nsadiag


def _evidence(waits: ProcessWaits) -> Evidence:
    stall = StallEvidence(6.0, 2.0, 0.0, samples=[], waits=waits)
    return Evidence({"command": ["python", "train.py"]}, [], {}, None,
                    ProcessOutcome(None, 9, "SIGKILL", True, "stall"), stall, None, 0)


def test_a_stopped_process_is_read_as_stopped_from_proc():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        assert read_waits(child.pid).stopped is None  # a sleep is a wait, not a stop
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while (waits := read_waits(child.pid)).stopped is None and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        assert waits.stopped == Stopped("T")
        assert ProcessWaits.from_dict(waits.to_dict()).stopped == Stopped("T")
    finally:
        child.kill()
        child.wait()


def test_the_chain_of_a_stopped_process_says_what_resumes_it_even_without_stacks():
    waits = ProcessWaits(41, ("python", "train.py"), (ThreadWait(41, "do_signal_stop"),),
                         stopped=Stopped("T"))
    chain = wait_chain(_evidence(waits))
    assert chain is not None and chain.end == "stopped"
    assert chain.printed().startswith("pid 41 is stopped (state T): nothing in it runs")
    assert "only SIGCONT resumes it" in chain.printed()
    said = chain_next(chain)
    assert said is not None and said.startswith("Find what stops pid 41: ")
    assert "`kill -CONT` resumes" in said


def test_a_process_held_by_a_tracer_names_the_tracer():
    waits = ProcessWaits(41, ("python", "train.py"), (ThreadWait(41, "ptrace_stop"),),
                         stopped=Stopped("t", 77, ("gdb", "-p", "41")))
    chain = wait_chain(_evidence(waits))
    assert chain is not None and "held stopped by its tracer, pid 77 (`gdb -p 41`)" in \
        chain.printed()
    assert chain_next(chain).startswith("Continue or detach the tracer pid 77")


STOPS_ITSELF = textwrap.dedent("""
    import os, signal, torch
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for _ in range(3):  # steps: the stall timeout holds from here, not the start-up grace
        model(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
    print("stopping", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
    print("resumed", flush=True)
""")


def test_a_script_that_stops_itself_is_told_stopped_not_a_lock_wait(tmp_path):
    script = tmp_path / "stops_itself.py"
    script.write_text(STOPS_ITSELF)
    done = nsadiag("run", "--stall-timeout", "4", "--out", str(tmp_path / "run"), "--",
                   sys.executable, str(script), env=checkout_env())
    assert done.returncode == 1, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    finding = summary["finding"]
    assert finding["chain"].startswith("pid ") and " is stopped (state T)" in finding["chain"]
    assert finding["next_action"].startswith("Find what stops pid ")
    assert "resumed" not in (tmp_path / "run" / "stdout.txt").read_text()
