"""The one parent loop (nsadiag.harness.session) and the times it runs under
(nsadiag.harness.times), on a tree of the test's own making."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsadiag.harness.session import Tree, watch_session
from nsadiag.harness.streams import UNBOUNDED_STEPS, Stream
from nsadiag.harness.times import (
    CAPTURE_FINISH_S,
    CAPTURE_WINDOW_MAX_S,
    CAPTURE_WINDOW_MIN_S,
    SAMPLE_TIMEOUT_S,
    WatchTimes,
)

# writes a start event naming itself, then waits on a lock it never gets: a stall
STUCK = """
import json, sys, threading, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"kind": "start", "pid": __import__("os").getpid(), "t": time.time()})
            + "\\n")
lock = threading.Lock(); lock.acquire(); lock.acquire()
"""


class _OneProcess(Tree):
    """A child the test started, with one heartbeat stream, killed at the end."""

    def __init__(self, stream: Stream, proc: subprocess.Popen):
        super().__init__([stream])
        self.proc = proc
        self.stopped = 0

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.stopped += 1
        self.proc.kill()
        self.proc.wait()


def _start(tmp_path: Path, code: str) -> tuple[Stream, subprocess.Popen]:
    events = tmp_path / "events.jsonl"
    events.touch()
    proc = subprocess.Popen([sys.executable, "-c", code, str(events)])
    return Stream("main", events, UNBOUNDED_STEPS), proc


def test_a_stall_is_captured_from_every_stream_and_the_tree_stopped_once(tmp_path):
    stream, proc = _start(tmp_path, STUCK)
    tree = _OneProcess(stream, proc)
    end = watch_session(tree, WatchTimes(stall_timeout_s=2.0, startup_grace_s=0.0))
    assert end.reason == "stall"
    assert tree.stopped == 1 and proc.poll() is not None
    assert set(end.stalls) == {"main"} and end.stalls["main"].since_last_event_s >= 2.0
    assert end.streams == [stream] and stream.pid == proc.pid
    assert "main" in end.load["main_thread"] and end.load["start"]["cpus"] >= 1
    assert end.ended_at >= end.started


def test_a_tree_that_ends_by_itself_ends_the_session_without_a_capture(tmp_path):
    stream, proc = _start(tmp_path, "import sys, json, time\n"
                                    "open(sys.argv[1], 'a').write(json.dumps({'kind': 'end', "
                                    "'t': time.time()}) + '\\n')")
    tree = _OneProcess(stream, proc)
    end = watch_session(tree, WatchTimes(stall_timeout_s=30.0))
    assert end.due is None and end.stalls == {} and end.gpu is None
    assert tree.stopped == 1 and stream.counts["end"] == 1


def test_a_stop_request_unwinds_through_the_trees_stop(tmp_path, monkeypatch):
    from nsadiag.harness import stop

    stream, proc = _start(tmp_path, STUCK)
    tree = _OneProcess(stream, proc)
    requested = {"n": 0}

    def wait(seconds: float) -> None:
        requested["n"] += 1
        if requested["n"] == 3:
            monkeypatch.setattr(stop, "check", _raise)
        time.sleep(seconds)

    tree.wait = wait  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        watch_session(tree, WatchTimes(stall_timeout_s=60.0))
    assert tree.stopped == 1 and proc.poll() is not None


def _raise() -> None:
    raise KeyboardInterrupt


def test_the_times_derive_and_check_each_other():
    times = WatchTimes(stall_timeout_s=60.0)
    assert times.budget_s == math.inf and times.pg_timeout_s == 180.0
    assert times.capture_window_s == CAPTURE_WINDOW_MAX_S
    assert WatchTimes(stall_timeout_s=1.0).capture_window_s == CAPTURE_WINDOW_MIN_S
    assert WatchTimes(stall_timeout_s=5.0).capture_window_s == 2.5
    assert times.evidence_by_s == 60.0 + max(CAPTURE_WINDOW_MAX_S, SAMPLE_TIMEOUT_S) + \
        CAPTURE_FINISH_S
    assert times.collective_outlasts_capture()
    # a process-group timeout given on purpose shorter than the stall is kept, and said
    short = WatchTimes(stall_timeout_s=40.0, pg_timeout_s=4.0)
    assert short.pg_timeout_s == 4.0 and not short.collective_outlasts_capture()


@pytest.mark.parametrize("changes, named", [
    ({"stall_timeout_s": 0.0}, "stall_timeout_s"),
    ({"stall_timeout_s": -1.0}, "stall_timeout_s"),
    ({"budget_s": 0}, "budget_s"),
    ({"startup_grace_s": -1.0}, "startup_grace_s"),
    ({"startup_grace_s": math.inf}, "startup_grace_s"),
    ({"stall_timeout_s": 0.1, "poll_s": 0.2}, "stall_timeout_s"),
])
def test_times_that_cannot_hold_are_refused_in_one_line(changes, named):
    with pytest.raises(ValueError) as info:
        WatchTimes(**{"stall_timeout_s": 10.0, **changes})
    message = str(info.value)
    assert message.startswith(f"{named}:") and "\n" not in message


def test_a_job_with_its_own_short_process_group_timeout_says_so(tmp_path):
    from nsadiag.harness.jobs import job_times
    from nsadiag.spec import JobSpec, TrialSpec

    spec = TrialSpec(target="repro.lock_deadlock:make", stall_timeout_s=40.0,
                     out_dir=str(tmp_path)).validate()
    assert job_times(JobSpec("trial", spec, world_size=2, pg_timeout_s=4.0)) \
        .collective_outlasts_capture() is False
    assert job_times(JobSpec("trial", spec, world_size=2)).pg_timeout_s == 140.0
