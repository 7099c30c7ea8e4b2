"""The heartbeat writer never makes the watched program's main thread wait for the GIL more
than the sampler's own wake-up does: its writes keep the GIL, and the sampler's block event
is skipped, not waited for, while another thread writes (nsadiag.harness.heartbeat)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from nsadiag.harness.heartbeat import HeartbeatWriter
from nsadiag.probes.framemem import write_all


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_samplers_block_event_is_skipped_while_another_thread_writes(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path, buffered=True)
    counted = {"enters": 0, "block": None}
    writer.count_blocks(lambda: (counted["enters"], counted["block"]))
    counted.update(enters=5, block="blocks.4")
    held, release = threading.Event(), threading.Event()

    def hold_the_writer() -> None:  # the model's thread, inside a write
        with writer._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold_the_writer)
    holder.start()
    try:
        assert held.wait(30)
        answers: list[bool] = []
        sampler = threading.Thread(target=lambda: answers.append(writer.write_blocks(wait=False)))
        sampler.start()
        sampler.join(30)
        # it came back while the lock was held: it did not wait for it
        assert not sampler.is_alive() and answers == [False]
        assert writer.module_events == 0
    finally:
        release.set()
        holder.join(30)
    counted.update(enters=7, block="blocks.6")
    assert writer.write_blocks(wait=False)  # the next sample writes them all, once
    writer.close()
    modules = [e for e in _events(path) if e["kind"] == "module"]
    assert [(e["module"], e["edges"]) for e in modules] == [("blocks.6", 7)]


def test_heartbeat_writes_never_go_through_calls_that_let_the_gil_go(tmp_path: Path,
                                                                      monkeypatch):
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path, buffered=True)

    def refused(*args, **kwargs):
        raise AssertionError("a heartbeat write let the GIL go")

    # os.write and os.pread release the GIL around the system call
    monkeypatch.setattr(os, "write", refused)
    monkeypatch.setattr(os, "pread", refused)
    writer.start("forward", 0)
    writer.pulse({"progress": True})
    writer.step_done(step_s=0.1, forward_s=0.05, backward_s=0.05)
    monkeypatch.undo()
    writer.close()
    events = _events(path)
    assert [e["kind"] for e in events] == ["start", "pulse", "step"]
    assert [e["seq"] for e in events] == [0, 1, 2]
    assert all(e["rss"] > 0 for e in events)  # read from /proc/self/statm, GIL held
    assert writer.lost is None


def test_a_write_the_system_refuses_stops_the_events_without_raising():
    read_only = os.open(os.devnull, os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            write_all(read_only, b"x")
    finally:
        os.close(read_only)
    writer = HeartbeatWriter(Path("/dev/full"))  # every write fails, as on a full disk
    writer.start("forward", 0)  # the watched code goes on
    assert writer.lost is not None and "No space left" in writer.lost
    writer.close()


def test_the_observer_adds_one_thread_and_polls_compiles_on_its_wake_ups(tmp_path: Path):
    """The torch hooks and the compile polling ride on the sampler's wake-ups (each
    wake-up of a thread of ours takes the GIL from the main thread): no thread of their
    own, and Dynamo's records are read at most every COMPILE_POLL_S however often the
    sampler wakes."""
    import torch  # noqa: F401  (the hooks go in once the program uses torch)
    import torch._dynamo  # noqa: F401

    from nsadiag.harness import watched

    before = {thread.ident for thread in threading.enumerate()}
    heartbeat = watched.ProcessHeartbeat(tmp_path)
    polls: list[int] = []
    heartbeat.start()
    try:
        added = [t.name for t in threading.enumerate() if t.ident not in before]
        assert added == ["nsadiag-sampler"]
        deadline = time.monotonic() + 60  # the sampler's first ticks install the hooks
        while heartbeat.stage != "compiles" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert heartbeat.stage == "compiles" and heartbeat.finder is not None
        heartbeat.sampler.stop()  # ticks from here on are this test's own
        assert heartbeat.compiles is not None
        heartbeat.compiles.poll = lambda: polls.append(1) or 0  # type: ignore[method-assign]
        heartbeat.next_compile_poll = 0.0
        for _ in range(5):
            heartbeat._tick()
        assert polls == [1]  # once, not at every tick
        heartbeat.next_compile_poll = 0.0  # COMPILE_POLL_S later
        heartbeat._tick()
        assert polls == [1, 1]
    finally:
        heartbeat.stop(remove=True)


def test_a_phase_entered_soon_after_an_event_changes_in_memory_only(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path, buffered=True)
    writer.enter_phase("forward", 0, quiet_s=3600.0)  # nothing written yet: written
    writer.enter_phase("backward", 0, quiet_s=3600.0)  # right after it: in memory
    assert (writer.phase, writer.step) == ("backward", 0)
    writer.step_done(step_s=0.01, forward_s=0.005, backward_s=0.005)
    writer.enter_phase("forward", 1, quiet_s=3600.0)
    assert (writer.phase, writer.step) == ("forward", 1)
    writer.enter_phase("backward", 1, quiet_s=0.0)  # a quiet gap: written
    writer.close()
    kinds = [(e["kind"], e["phase"], e["step"]) for e in _events(path)]
    assert kinds == [("start", "forward", 0), ("step", "optimizer", 0),
                     ("start", "backward", 1)]


def test_a_buffered_writers_block_events_read_no_memory_of_their_own(tmp_path: Path,
                                                                     monkeypatch):
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path, buffered=True)
    counted = {"enters": 0}
    writer.count_blocks(lambda: (counted["enters"], "blocks.0"))
    readings = iter([111, 222, 333])
    monkeypatch.setattr(writer, "_rss", lambda: next(readings))
    writer.start("forward", 0)  # reads 111
    for enters in (3, 6):
        counted["enters"] = enters
        writer.write_blocks()  # module events: the reading before them, no read
    writer.step_done(step_s=0.01, forward_s=0.01, backward_s=0.0)  # reads 222
    writer.close()
    rss = [(e["kind"], e["rss"]) for e in _events(path)]
    assert rss == [("start", 111), ("module", 111), ("module", 111), ("step", 222)]


def test_a_watched_processs_step_ends_are_kept_and_written_ahead_of_the_next_event(
        tmp_path: Path, monkeypatch):
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path, buffered=True)
    readings = iter([111, 222, 333])
    monkeypatch.setattr(writer, "_rss", lambda: next(readings))
    ended = time.time()
    writer.step_done(step_s=0.01, forward_s=0.004, backward_s=0.006)  # kept, reads 111
    writer.step = 1
    writer.step_done(step_s=0.02, forward_s=0.01, backward_s=0.01)  # kept, too soon to read
    assert writer.events == 2  # progress at once, for the sampler
    assert not path.read_text()  # nothing written on the model's thread
    writer.pulse({"progress": True})  # any next event writes the kept steps ahead of it
    events = _events(path)
    assert [(e["kind"], e["step"], e["rss"]) for e in events] == \
        [("step", 0, 111), ("step", 1, None), ("pulse", 1, 222)]
    assert [e["seq"] for e in events] == [0, 1, 2]
    kept = events[1]
    # the time the step ended and its own times
    assert ended <= events[0]["t"] <= kept["t"] <= events[2]["t"]
    assert (kept["step_s"], kept["forward_s"], kept["backward_s"]) == (0.02, 0.01, 0.01)
    assert kept["cuda_alloc"] is None and kept["phase"] == "optimizer"
    writer._step_read -= 1.0  # as if the last reading at a step end was a second ago
    writer.step = 2
    writer.step_done(step_s=0.03, forward_s=0.01, backward_s=0.02)  # kept, reads 333
    writer.close()
    assert [(e["kind"], e["step"], e["rss"]) for e in _events(path)][-1] == ("step", 2, 333)


def test_kept_steps_reach_the_file_at_the_samplers_next_tick_and_at_close(tmp_path: Path):
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path, buffered=True)  # no blocks counted: a compiled model
    writer.step_done(step_s=0.01, forward_s=0.005, backward_s=0.005)
    writer.step = 1
    writer.step_done(step_s=0.01, forward_s=0.005, backward_s=0.005)
    assert not path.read_text()
    assert writer.write_blocks(wait=False)  # the sampler's tick
    assert [e["step"] for e in _events(path) if e["kind"] == "step"] == [0, 1]
    writer.step = 2
    writer.step_done(step_s=0.01, forward_s=0.005, backward_s=0.005)  # kept
    writer.close()
    assert [e["step"] for e in _events(path) if e["kind"] == "step"] == [0, 1, 2]


def test_an_unbuffered_writer_writes_every_step_through(tmp_path: Path):
    """A trial's own writer (unbuffered) keeps every step's reading: its steps are the
    measurement."""
    path = tmp_path / "events.jsonl"
    writer = HeartbeatWriter(path)
    for step in range(3):
        writer.step = step
        writer.step_done(step_s=0.01, forward_s=0.005, backward_s=0.005)
        assert len(_events(path)) == step + 1
    writer.close()
    assert all(isinstance(e["rss"], int) for e in _events(path))
