"""A stall's capture ends by its deadline (nsadiag.harness.capture.capture_all), however
slow a stack sample is, and the evidence says which samples were cut off or not taken.

The stack sampler is faked: one that keeps to the time limit it is given (py-spy is killed
at it) and one that ignores it. The bounds asserted are far above the deadlines and far
below the unbounded times (a fake sample takes 20 s), so a loaded machine cannot fail them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from nsadiag.evidence import StackFrame, StackSample, ThreadStack
from nsadiag.harness import capture
from nsadiag.harness.runcmd import _CommandTree
from nsadiag.harness.streams import Due
from nsadiag.harness.times import CAPTURE_FINISH_S, CAPTURE_WINDOW_MIN_S
from nsadiag.hosts.address import JobShape
from nsadiag.hosts.shared import SharedView
from nsadiag.probes import stacks

UNBOUNDED_S = 20.0
STALL = Due("stall", quiet_s=10.0, opportunity_s=10.0, limit_s=10.0, stretched=False)


@pytest.fixture
def stuck():
    """A process that waits forever on a lock (no faulthandler registered)."""
    proc = subprocess.Popen([sys.executable, "-c",
                             "import threading; l = threading.Lock(); l.acquire(); "
                             "l.acquire()"])
    yield proc
    proc.kill()
    proc.wait(timeout=30)


@pytest.fixture
def released():
    """Set at the end of the test: a fake sample still sleeping then returns."""
    event = threading.Event()
    yield event
    event.set()


def _sample(pid: int) -> StackSample:
    main = ThreadStack(thread_id=1, name="MainThread", active=False,
                       frames=[StackFrame(function="acquire", file="/u/t.py", line=3)])
    return StackSample(t=time.time(), pid=pid, threads=[main], cpu_seconds=0.0, native=True)


def test_a_sample_past_the_window_is_cut_off_and_the_rest_not_taken(monkeypatch, stuck,
                                                                    released, tmp_path):
    calls: list[float] = []

    def keeps_its_limit(pid, native=False, timeout_s=10.0, faulthandler_file=None,
                        local_names=False):
        calls.append(timeout_s)
        if len(calls) == 1:
            return _sample(pid)
        released.wait(min(timeout_s, UNBOUNDED_S))  # py-spy is killed at its time limit
        return f"py-spy: timed out after {timeout_s:g} s on pid {pid}"

    monkeypatch.setattr(stacks, "capture", keeps_its_limit)
    window = 1.0
    started = time.monotonic()
    found = capture.capture_all({"main": stuck.pid}, {"main": tmp_path}, STALL, window)
    elapsed = time.monotonic() - started
    assert elapsed < window + 5.0, elapsed
    stall = found["main"]
    assert len(stall.samples) == 1 and stall.stacks_class is not None
    # the second sample was given only what was left of the window (or never started on a
    # machine slow enough to leave it less than MIN_SAMPLE_S), the third never started
    assert all(limit <= window for limit in calls[1:]), calls
    late = [r for r in stall.unavailable if "capture window" in r]
    assert any(r.endswith("(cut off at the end of the capture window)") for r in late) or \
        "stack sample 2-3 of 3: not taken, the capture window had ended" in late, late
    assert any(r.startswith("stack sample ") and "3 of 3: not taken" in r for r in late), late
    assert stall.waits is not None  # what it waits on was still read, after the samples


def test_a_sample_that_ignores_its_limit_is_left_behind_at_the_deadline(monkeypatch, stuck,
                                                                       released, tmp_path):
    def hangs(pid, native=False, timeout_s=10.0, faulthandler_file=None, local_names=False):
        released.wait(UNBOUNDED_S)
        return _sample(pid)

    monkeypatch.setattr(stacks, "capture", hangs)
    # the first sample may take its whole time limit: a short one keeps the test short
    monkeypatch.setattr(capture, "SAMPLE_TIMEOUT_S", 1.0)
    started = time.monotonic()
    found = capture.capture_all({"main": stuck.pid}, {"main": tmp_path}, STALL, 1.0,
                                ends_by=started + 1.0)
    elapsed = time.monotonic() - started
    assert 1.0 + CAPTURE_FINISH_S - 0.5 < elapsed < 1.0 + CAPTURE_FINISH_S + 5.0, elapsed
    stall = found["main"]
    assert stall.samples == [] and stall.stacks_class is None
    [why] = stall.unavailable
    assert why.startswith("capture cut off: still running ")
    assert why.endswith(" s after it began, before its stack samples were all taken")
    assert stall.since_last_event_s == STALL.quiet_s
    # a capture left behind that finishes later does not change what was returned
    released.set()
    time.sleep(0.2)
    assert found["main"].samples == []


def test_a_host_that_sees_the_stall_late_ends_its_capture_with_the_first(tmp_path):
    shared = SharedView(JobShape(None, 2), "host2")
    tree = _CommandTree(None, tmp_path, shared)
    window = 5.0
    assert shared.window_ends(window) is None
    now = time.monotonic()
    assert now + window - 0.5 < tree.capture_ends(window) < now + window + 0.5
    shared.stall = {"host": "host1", "t": time.time() - 2.0}
    now = time.monotonic()
    assert now + window - 2.5 < tree.capture_ends(window) < now + window - 1.5
    # a signal long past, or a clock far ahead, keeps the window within its limits
    shared.stall = {"host": "host1", "t": time.time() - 60.0}
    now = time.monotonic()
    assert now + CAPTURE_WINDOW_MIN_S - 0.5 < tree.capture_ends(window) < \
        now + CAPTURE_WINDOW_MIN_S + 0.5
    shared.stall = {"host": "host1", "t": time.time() + 60.0}
    now = time.monotonic()
    assert now + window - 0.5 < tree.capture_ends(window) < now + window + 0.5
