"""Thread names across the samples of one stall (nsadiag.probes.stacks.carry_thread_names),
on stacks captured from repro/scripts/lock_across_queue_put.py once it deadlocked: py-spy's
JSON (names_pyspy.json) and the faulthandler dump of the same moment (names_faulthandler.txt),
paths shortened."""

from __future__ import annotations

import copy

from nsadiag.evidence import StackSample, StallEvidence
from nsadiag.probes.stacks import (
    FROM_FAULTHANDLER,
    carry_thread_names,
    from_faulthandler,
    parse_faulthandler,
    parse_py_spy_json,
)
from nsadiag.verdict.chain import stall_chain
from tests.helpers import STACK_FIXTURES

PID = 26081
LOADER, MAIN = 140365289133760, 140365858974592


def _py_spy(t: float) -> StackSample:
    return parse_py_spy_json((STACK_FIXTURES / "names_pyspy.json").read_text(), PID, 1.0,
                             t=t)


def _faulthandler(t: float) -> StackSample:
    """A sample cut off at the end of the capture window, taken by the faulthandler rung,
    as stacks.capture notes it."""
    sample = parse_faulthandler((STACK_FIXTURES / "names_faulthandler.txt").read_text(),
                                PID, 1.0, t=t)
    sample.note = f"{FROM_FAULTHANDLER}: py-spy: timed out after 1.2 s on pid {PID}"
    return sample


def _names(sample: StackSample) -> dict[int, str | None]:
    return {thread.thread_id: thread.name for thread in sample.threads}


def test_the_captured_inputs_are_one_process_seen_both_ways():
    py_spy, dumped = _py_spy(1.0), _faulthandler(2.0)
    assert _names(py_spy) == {LOADER: "loader", MAIN: "MainThread"}
    # faulthandler names no thread: the loader is only its ident, the main thread a guess
    assert _names(dumped) == {LOADER: None, MAIN: "MainThread"}
    assert from_faulthandler(dumped) and not from_faulthandler(py_spy)


def test_a_late_faulthandler_sample_takes_the_names_py_spy_read_earlier():
    samples = [_py_spy(1.0), _py_spy(2.0), _faulthandler(3.0)]
    carry_thread_names(samples)
    assert [_names(s) for s in samples] == [{LOADER: "loader", MAIN: "MainThread"}] * 3


def test_a_py_spy_sample_without_a_name_takes_it_from_another_sample():
    unnamed = _py_spy(2.0)
    next(t for t in unnamed.threads if t.thread_id == LOADER).name = None
    samples = [unnamed, _py_spy(3.0)]
    carry_thread_names(samples)
    assert _names(samples[0])[LOADER] == "loader"


def test_names_are_never_invented_nor_taken_from_another_process_nor_overwritten():
    other = _py_spy(1.0)
    other.pid = PID + 1  # another process whose thread has the same ident
    alone = _faulthandler(2.0)
    carry_thread_names([other, alone])
    assert _names(alone)[LOADER] is None  # no sample of this process named it
    renamed = _py_spy(1.0)
    next(t for t in renamed.threads if t.thread_id == LOADER).name = "loader-0"
    later = _py_spy(2.0)
    carry_thread_names([renamed, later])
    assert _names(renamed)[LOADER] == "loader-0" and _names(later)[LOADER] == "loader"


def test_the_chain_names_the_loader_when_the_last_sample_is_faulthandlers():
    # the chain reads a stall's last sample: cut off under load, it came from faulthandler
    samples = [_py_spy(1.0), _py_spy(2.0), _faulthandler(3.0)]
    unnamed = copy.deepcopy(samples)
    carry_thread_names(samples)
    named = stall_chain(StallEvidence(since_last_event_s=6.0, window_s=3.0, cpu_delta_s=0.0,
                                      samples=samples)).printed()
    assert "thread loader" in named and f"thread {LOADER}" not in named
    assert f"thread {LOADER}" in stall_chain(StallEvidence(
        since_last_event_s=6.0, window_s=3.0, cpu_delta_s=0.0, samples=unnamed)).printed()
