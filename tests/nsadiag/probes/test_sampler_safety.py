"""The sampler reads another thread's loop counters without touching its frame: values come
from the frame's memory (nsadiag.probes.framemem), never from ``frame.f_locals``, so no
local outlives its binding, and a ``range`` loop's end comes from its iterator."""

from __future__ import annotations

import ast
import gc
import sys
import threading
import weakref
from pathlib import Path

import pytest

from nsadiag.probes import framemem
from nsadiag.probes.profile import read_profile
from nsadiag.probes.sampler import Sampler

READER = framemem.reader()
needs_reader = pytest.mark.skipif(READER is None, reason="frame layout not confirmed here")


class Payload:
    """Stands for a tensor a loop rebinds: only its weak reference is watched."""


def _frame_of(thread: threading.Thread, name: str):
    frame = sys._current_frames()[thread.ident]
    while frame is not None and frame.f_code.co_name != name:
        frame = frame.f_back
    return frame


def _run_in_thread(target, *args):
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


@needs_reader
@pytest.mark.parametrize("value", [0, 7, -7, 2**40 + 3, -(2**61), 2**100 + 1])
def test_ints_are_decoded_from_memory_of_a_waiting_thread(value: int):
    ready, go = threading.Event(), threading.Event()

    def holder(number: int) -> None:
        counter = number  # noqa: F841 - read from memory by the test
        ready.set()
        go.wait(10)

    thread = _run_in_thread(holder, value)
    try:
        assert ready.wait(10)
        ints = READER.int_locals(_frame_of(thread, "holder"), 8)
        assert ints == {"number": value, "counter": value}
    finally:
        go.set()
        thread.join(10)


@needs_reader
def test_a_range_loop_gives_its_end_and_a_non_range_loop_none():
    at_token, go = threading.Event(), threading.Event()

    def prefill(sequence: list[int]) -> None:
        for t in range(3, len(sequence) * 2 + 1, 2):
            if t == 9:
                at_token.set()
                go.wait(10)
        for item in sequence:
            if item == 42:
                at_token.set()
                go.wait(10)

    thread = _run_in_thread(prefill, [0, 42, 5, 1, 2, 3])
    try:
        assert at_token.wait(10)
        frame = _frame_of(thread, "prefill")
        assert READER.int_locals(frame, 8)["t"] == 9
        assert READER.range_end(frame, 9) == 13  # range(3, 13, 2)
        assert READER.range_end(frame, 7) is None  # not the value it yielded last
        at_token.clear()
        go.set()
        go.clear()
        assert at_token.wait(10)
        assert READER.int_locals(frame, 8)["item"] == 42
        assert READER.range_end(frame, 42) is None
    finally:
        go.set()
        thread.join(10)


@needs_reader
def test_a_loop_counter_a_closure_reads_is_read_through_its_cell():
    at_token, go = threading.Event(), threading.Event()

    def decode(n: int) -> None:
        for step in range(n):
            def peek() -> int:
                return step  # noqa: B023 - the cell is the point
            if peek() == 5:
                at_token.set()
                go.wait(10)

    thread = _run_in_thread(decode, 10)
    try:
        assert at_token.wait(10)
        frame = _frame_of(thread, "decode")
        assert READER.int_locals(frame, 8) == {"n": 10, "step": 5}
        assert READER.range_end(frame, 5) == 10
    finally:
        go.set()
        thread.join(10)


def test_a_sampled_frames_rebound_local_is_freed_at_once_and_the_loop_has_its_end(
        tmp_path: Path):
    # reading f_locals from the sampler would copy every local into the frame's dict and
    # keep a rebound one alive until the next read; a memory read keeps nothing
    source = tmp_path / "user_loop.py"
    source.write_text(
        "import threading\n"
        "def work(n, sampled, results, Payload, weakref):\n"
        "    for token in range(n):\n"
        "        payload = Payload()\n"
        "        alive = weakref.ref(payload)\n"
        "        sampled.wait(0.05)\n"
        "        payload = None\n"
        "        results.append(alive() is None)\n"
        "    return token\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    results: list[bool] = []
    sampled = threading.Event()
    thread = threading.Thread(target=namespace["work"],
                              args=(60, sampled, results, Payload, weakref), daemon=True)
    profile_path = tmp_path / "profile.json"
    pulses: list[dict] = []
    thread.start()  # the sampler watches the thread it is given by its ident
    sampler = Sampler(pulses.append, profile_path, interval_s=0.01, pulse_s=0.1,
                      main=thread)
    sampler.start()
    try:
        thread.join(60)
    finally:
        sampler.stop()
    gc.collect()
    assert len(results) == 60 and all(results)
    assert any(pulse["progress"] for pulse in pulses)
    profile = read_profile(profile_path)
    assert profile["samples"] > 10
    if READER is not None:
        loop = next(loop for loop in profile["loops"] if loop["variable"] == "token")
        assert loop["end"] == 60 and loop["advanced"] > 0
    assert sampler.failures == 0


def test_the_sampler_never_asks_a_frame_for_its_locals():
    # no attribute access to f_locals, and no locals()/vars() call, in the code the sampler
    # thread runs (docstrings may name it)
    root = Path(__file__).resolve().parents[3] / "nsadiag" / "probes"
    for name in ("sampler.py", "framemem.py", "loops.py", "counters.py"):
        tree = ast.parse((root / name).read_text())
        reads = [node.lineno for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and node.attr == "f_locals"
                 or isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                 and node.func.id in ("locals", "vars")]
        assert reads == [], (name, reads)
