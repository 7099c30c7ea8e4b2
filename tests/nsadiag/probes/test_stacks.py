"""py-spy stacks: the parser and classifier on real captured dumps (tests/fixtures/stacks/,
see samples.json for when each was taken and the process CPU time then), and capture /
process_cpu_seconds on live children that the tests kill before they return."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nsadiag.evidence import Evidence, ProcessOutcome, StackSample, StallEvidence
from nsadiag.probes import frames, stacks
from nsadiag.probes.frames import classify, hot_frame, stacks_change, wait_frame
from nsadiag.probes.stacks import capture, parse_py_spy_json, process_cpu_seconds
from nsadiag.verdict import decide
from tests.helpers import STACK_FIXTURES, VERDICT_FIXTURES
from tests.procs import blocked, wait_for

MANIFEST = json.loads((STACK_FIXTURES / "samples.json").read_text())


def samples(case: str, native: bool = False) -> list[StackSample]:
    """The recorded samples of one child, Python-only ones or the native one."""
    return [parse_py_spy_json((STACK_FIXTURES / entry["file"]).read_text(), pid=1000,
                              cpu_seconds=entry["cpu_seconds"], t=entry["t"])
            for entry in MANIFEST[case] if entry["native"] == native]


def functions(sample: StackSample) -> list[str]:
    return [frame.function for frame in sample.threads[0].frames]


@contextmanager
def child(script: str) -> Iterator[subprocess.Popen]:
    """A fixture child that has printed "ready"; killed and reaped on the way out."""
    proc = subprocess.Popen([sys.executable, str(STACK_FIXTURES / script)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


# ---- parser and classifier on captured dumps ---------------------------------------------


def test_parser_reads_a_thread_blocked_on_a_lock():
    sample = samples("lock")[0]
    assert sample.pid == 1000 and sample.cpu_seconds == MANIFEST["lock"][0]["cpu_seconds"]
    assert sample.native is False and len(sample.threads) == 1
    thread = sample.threads[0]
    assert (thread.name, thread.active, thread.owns_gil) == ("MainThread", False, False)
    assert [(f.function, f.line, f.is_native) for f in thread.frames] == [
        ("hold_twice", 16, False), ("<module>", 19, False)]
    assert thread.frames[0].file.endswith("tests/fixtures/stacks/lock_child.py")


def test_parser_marks_native_frames_by_their_shared_object():
    sample = samples("lock", native=True)[0]
    assert sample.native is True
    frames = sample.threads[0].frames
    assert [f.is_native for f in frames] == [True, True, True, True, False, False, True]
    assert functions(sample)[2:6] == ["PyThread_acquire_lock_timed",
                                      "lock_PyThread_acquire_lock", "hold_twice", "<module>"]
    assert frames[2].file.endswith("libpython3.11.so.1.0") and frames[2].line == 0
    assert frames[0].function.startswith("0x")  # libc has no symbols here
    assert wait_frame(sample.threads[0]).function in ("hold_twice", "PyThread_acquire_lock_timed")


def test_parser_rejects_what_is_not_a_thread_list():
    with pytest.raises(ValueError, match="expected a list of threads"):
        parse_py_spy_json('{"pid": 1}', pid=1, cpu_seconds=None)


def test_lock_child_reads_as_waiting():
    recorded = samples("lock")
    assert frames.cpu_fraction(recorded) == pytest.approx(0.0, abs=0.02)
    assert not stacks_change(recorded)
    assert classify(recorded) == "waiting"


def test_python_spin_reads_as_busy_python():
    recorded = samples("spin")
    assert frames.cpu_fraction(recorded) > 0.5
    assert {functions(sample)[0] for sample in recorded} == {"spin"}
    assert len({sample.threads[0].frames[0].line for sample in recorded}) > 1
    assert classify(recorded) == "busy-python"


def test_matmul_reads_as_busy_native_with_native_frames_below_the_python_line():
    recorded = samples("matmul")
    assert frames.cpu_fraction(recorded) > 0.5
    # py-spy shows one Python frame, the matmul line, in every sample: the time is below it.
    assert {(s.threads[0].frames[0].function, s.threads[0].frames[0].line)
            for s in recorded} == {("multiply", 18)}
    assert classify(recorded) == "busy-native"
    native = samples("matmul", native=True)[0]
    frame, count, native_below = hot_frame([native])
    assert (frame.function, frame.line, count, native_below) == ("multiply", 18, 1, True)


def test_one_native_sample_tells_python_work_from_a_native_op():
    # Under --native py-spy puts nothing below the spinning Python frame (CPython's own
    # evaluation frames are replaced by it) but MKL's kernel below the matmul line.
    spin, matmul, lock = (samples(case, native=True) for case in ("spin", "matmul", "lock"))
    assert functions(spin[0])[:2] == ["spin", "<module>"]
    assert functions(matmul[0])[:2] == ["mkl_blas_avx512_sgemm_kernel_0", "multiply"]
    assert classify(spin) == "busy-python"
    assert classify(matmul) == "busy-native"
    assert classify(lock) == "waiting"


def test_recorded_samples_decide_the_stall_verdicts():
    def stalled(case: str, cpu_delta: float) -> Evidence:
        recorded = samples(case)
        stall = StallEvidence(since_last_event_s=10.0, window_s=10.0, cpu_delta_s=cpu_delta,
                              samples=recorded)
        outcome = ProcessOutcome(exit_code=None, signal=9, signal_name="SIGKILL",
                                 killed_by_runner=True, kill_reason="stall", wall_s=20.0)
        return Evidence(spec={}, events=[], event_counts={}, result=None, outcome=outcome,
                        stall=stall, expected_events_per_step=None, total_steps=1)

    lock = decide(stalled("lock", 0.0))
    assert lock.name == "DEADLOCK" and lock.facts.position.confidence in ("high", "medium")
    assert (lock.facts.stall.wait_function or lock.facts.hot.hot_function) == "hold_twice"
    matmul = decide(stalled("matmul", 9.9))
    assert matmul.name == "STALL-BUSY" and matmul.facts.hot.hot_function == "multiply"
    spin = decide(stalled("spin", 9.9))
    assert spin.name == "STALL-BUSY" and spin.facts.stall.stacks_class == "busy-python"


def test_a_rank_in_all_reduce_reads_as_in_collective():
    path = VERDICT_FIXTURES / "collective_all_reduce.json"
    stall = Evidence.from_dict(json.loads(path.read_text())).stall
    assert classify(stall.samples) == "in-collective"
    thread, frame, count = frames.find_collective(stall.samples)
    assert (thread.name, frame.function, count) == ("MainThread", "all_reduce", 3)


# ---- live capture --------------------------------------------------------------------------


def test_capture_of_a_live_lock_child_with_and_without_native_frames():
    with child("lock_child.py") as proc:
        wait_for(blocked(proc.pid), 60, "the child to wait on its lock")
        python = capture(proc.pid, native=False, timeout_s=20)
        native = capture(proc.pid, native=True, timeout_s=20)
    assert isinstance(python, StackSample), python
    assert python.pid == proc.pid and python.cpu_seconds is not None
    top = python.threads[0].frames[0]
    assert (top.function, top.line, top.code) == ("hold_twice", 16, "lock.acquire()")
    assert wait_frame(python.threads[0]) == top
    assert isinstance(native, StackSample), native
    assert native.native is True and native.note is None
    assert "PyThread_acquire_lock_timed" in functions(native)
    assert proc.poll() is not None  # killed on leaving the block


def test_capture_of_a_dead_pid_returns_a_reason():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    assert capture(gone.pid, timeout_s=5) == f"py-spy: process {gone.pid} is gone"
    assert process_cpu_seconds(gone.pid) is None


def test_capture_timeout_returns_a_reason():
    with child("lock_child.py") as proc:
        reason = capture(proc.pid, timeout_s=0.001)
    assert reason == (f"py-spy: timed out after 0.001 s on pid {proc.pid}; faulthandler "
                      "fallback not possible: the process did not register SIGUSR1")


def _fake_py_spy(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "py-spy"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(0o755)
    return exe


def test_capture_reports_missing_py_spy_and_refused_ptrace(monkeypatch, tmp_path):
    with child("lock_child.py") as proc:
        monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
        missing = capture(proc.pid)
        refused = _fake_py_spy(tmp_path, "echo 'Error: Permission denied (os error 13)' >&2\n"
                                         "exit 1\n")
        monkeypatch.setattr(stacks, "py_spy_path", lambda: refused)
        denied = capture(proc.pid)
    no_handler = "faulthandler fallback not possible: the process did not register SIGUSR1"
    assert missing == f"py-spy: not found beside the interpreter or on PATH; {no_handler}"
    assert denied == (f"py-spy: ptrace refused for pid {proc.pid} "
                      f"(Error: Permission denied (os error 13)); {no_handler}")


def test_native_failure_falls_back_to_python_frames_with_a_note(monkeypatch, tmp_path):
    dump = STACK_FIXTURES / "lock_1.json"
    fake = _fake_py_spy(tmp_path, f'case "$*" in *--native*) echo "Error: Failed to unwind" >&2;'
                                  f' exit 1;; esac\ncat "{dump}"\n')
    monkeypatch.setattr(stacks, "py_spy_path", lambda: fake)
    with child("lock_child.py") as proc:
        sample = capture(proc.pid, native=True)
    assert isinstance(sample, StackSample), sample
    assert sample.native is False
    assert sample.note == ("native frames unavailable: py-spy: failed with exit 1 "
                           "(Error: Failed to unwind)")
    assert functions(sample) == ["hold_twice", "<module>"]


def test_process_cpu_seconds_of_a_spinning_child_rises():
    # a loaded machine gives the spinning child a fraction of a core: wait for its CPU
    # time to rise by 0.3 s (a generous deadline), and never longer than the wall time
    with child("spin_child.py") as proc:
        before, t0 = process_cpu_seconds(proc.pid), time.monotonic()

        def risen() -> float | None:
            now = process_cpu_seconds(proc.pid)
            return now if now - before > 0.3 else None

        after = wait_for(risen, 60, "the spinning child's CPU time to rise by 0.3 s")
        t1 = time.monotonic()
    assert after - before > 0.3
    assert after - before <= (t1 - t0) * 1.05 + 0.05  # one thread: at most one core
