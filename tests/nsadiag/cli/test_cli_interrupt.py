"""Ctrl-C keeps the diagnosis: `nsadiag run` interrupted in a terminal (Ctrl-C typed into a
pseudo-terminal, SIGTERM, SIGHUP) writes what it knew — the record, "interrupted by ... at
T (after N s)", report.md, summary.json — exits 128 + the signal, and leaves no process of
the command; a verdict decided before the interrupt (a deadlock whose stacks were being
sampled) is shown and kept; `nsadiag report` re-renders the interrupted directory. A
sweep's interrupted trial is recorded too (tests/nsadiag/cli/test_cli_sweep.py), and run again
on a resume, whose record then stands for it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from nsadiag.harness import stop
from tests.helpers import REPO, nsadiag
from tests.nsadiag.cli.test_run_command import SCRIPT
from tests.procs import wait_for
from tests.pty_cli import in_pty

NSADIAG = [sys.executable, "-m", "nsadiag.cli"]
DEADLINE_S = 300
"""Far shorter than the command runs uninterrupted (100,000 steps): a run that ends was
ended by the interrupt."""


def _left(run) -> list[int]:
    """The command's processes (from its record) still alive."""
    evidence = json.loads((run / "evidence.json").read_text())
    pids = [p["pid"] for p in evidence["processes"] if p.get("pid")]
    assert pids, evidence["processes"]
    return [pid for pid in pids if psutil.pid_exists(pid) and
            psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def _type_once(when):
    """An ``answer`` for in_pty that types Ctrl-C once ``when(output)`` holds."""
    typed = []

    def answer(output: str) -> bytes | None:
        if not typed and when(output):
            typed.append(True)
            return b"\x03"
        return None
    return answer


def _kept_and_rerendered(run, verdict: str) -> dict:
    record = json.loads((run / "record.json").read_text())
    assert record["verdict"]["name"] == verdict
    assert json.loads((run / "summary.json").read_text())["verdict"] == verdict
    again = nsadiag("report", str(run))
    assert again.returncode == 0, again.stderr
    assert "interrupted by the user (Ctrl-C) at " in (run / "report.md").read_text()
    assert _left(run) == []
    return record


def test_ctrl_c_mid_run_writes_the_record_and_the_report(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = tmp_path / "run"
    done = in_pty([*NSADIAG, "run", "--out", str(run), "--", sys.executable,
                   str(tmp_path / "train.py"), "ok", "100000"], DEADLINE_S, cwd=REPO,
                  answer=_type_once(lambda output: "step 20\r\n" in output
                                    or "step 20\n" in output))
    assert done.ended, done.output[-2000:]
    assert done.returncode == 130, done.output[-2000:]
    assert "INCONCLUSIVE" in done.output and "Traceback" not in done.output
    assert "interrupted by the user (Ctrl-C)" in done.output
    record = _kept_and_rerendered(run, "INCONCLUSIVE")
    facts = record["evidence"]["interrupted"]
    assert facts["signal"] == "SIGINT" and not facts["decided"] and facts["after_s"] > 0
    reason = record["verdict"]["reasons"][0]
    assert reason.startswith("interrupted by the user (Ctrl-C) at ")
    assert "before a verdict: the training process" in reason and " steps" in reason


class _Sampling:
    """Whether nsadiag is sampling the stacks of a stall it decided: a py-spy process
    under this test, looked for every 20 ms by a thread of its own (each py-spy dump lasts
    a fraction of a second, and the pseudo-terminal's reader looks only when output comes
    or every half second: it could miss all three)."""

    def __init__(self) -> None:
        self.seen = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self.done.is_set() and not self.seen.is_set():
            for child in psutil.Process().children(recursive=True):
                try:
                    if child.name() == "py-spy":
                        self.seen.set()
                except psutil.Error:
                    continue
            time.sleep(0.02)

    def __call__(self, output: str) -> bool:
        return self.seen.is_set()


def test_ctrl_c_mid_stall_keeps_the_verdict_already_decided(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    run = tmp_path / "run"
    sampling = _Sampling()
    try:
        done = in_pty([*NSADIAG, "run", "--stall-timeout", "6", "--out", str(run), "--",
                       sys.executable, str(tmp_path / "train.py"), "deadlock", "5"],
                      DEADLINE_S, cwd=REPO, answer=_type_once(sampling))
    finally:
        sampling.done.set()
    assert done.ended, done.output[-2000:]
    assert done.returncode == 130, done.output[-2000:]
    assert "DEADLOCK" in done.output, done.output[-2000:]
    record = _kept_and_rerendered(run, "DEADLOCK")
    assert record["evidence"]["interrupted"]["decided"] is True
    assert "after this verdict was decided" in record["verdict"]["reasons"][-1]


def _block(signum: int):
    """A preexec_fn: the command starts with ``signum`` blocked, as some CI runners and
    process supervisors start theirs (the mask is inherited through exec)."""
    return lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signum})


@pytest.mark.parametrize("signum, code, blocked", [
    (signal.SIGHUP, 129, False),
    (signal.SIGINT, 130, True),  # the handler alone would never run: nsadiag unblocks it
], ids=["sighup", "sigint-inherited-blocked"])
def test_a_stop_signal_keeps_the_diagnosis_and_exits_128_plus_it(tmp_path, signum, code,
                                                                 blocked):
    """(SIGTERM: tests/nsadiag/cli/test_cli_faults.py.)"""
    (tmp_path / "train.py").write_text(SCRIPT)
    run = tmp_path / "run"
    proc = subprocess.Popen([*NSADIAG, "run", "--out", str(run), "--", sys.executable,
                             str(tmp_path / "train.py"), "ok", "100000"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_block(signum) if blocked else None)
    try:
        stdout = run / "stdout.txt"
        wait_for(lambda: stdout.exists() and "step 20\n" in stdout.read_text(), 120,
                 "the command's steps")
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    said = f"interrupted by {stop.CAUSES[signum]}"
    assert said in out + err
    record = json.loads((run / "record.json").read_text())
    assert record["verdict"]["name"] == "INCONCLUSIVE"
    assert record["evidence"]["interrupted"]["signal"] == signal.Signals(signum).name
    assert said in (run / "report.md").read_text()
    assert _left(run) == []


def test_an_interrupted_trial_is_run_again_on_a_resume_and_its_rerun_stands_for_it(tmp_path):
    from nsadiag.rundir import append_record, load_records
    from nsadiag.verdict import Verdict
    from tests.helpers import one_step_record

    trials = tmp_path / "trials.jsonl"
    interrupted = one_step_record(1, "trial-0")
    interrupted.verdict = Verdict("INCONCLUSIVE", ["interrupted by the user"],
                                  {"interrupted": {"signal": "SIGINT"}})
    interrupted.evidence.interrupted = {"signal": "SIGINT"}
    append_record(trials, interrupted)
    assert [r.verdict_name for r in load_records(trials)] == ["INCONCLUSIVE"]  # reported
    append_record(trials, one_step_record(2, "trial-1"))
    assert [r.verdict_name for r in load_records(trials)] == ["INCONCLUSIVE", "OK"]
    rerun = one_step_record(1, "trial-2")  # the same spec but its directory: the resume
    append_record(trials, rerun)
    assert [(r.verdict_name, r.trial_dir) for r in load_records(trials)] == [
        ("OK", "trial-1"), ("OK", "trial-2")]
