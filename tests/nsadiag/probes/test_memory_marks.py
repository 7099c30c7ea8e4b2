"""The memory marks keep to their share of the model thread's time (MarkBudget), and a mark
that reads nothing never hands a later rise to one call that may not have made it."""

from __future__ import annotations

import os

import pytest

from nsadiag.probes import sampler as sampler_module
from nsadiag.probes.sampler import MarkBudget, Sampler


def test_the_budget_allows_a_burst_then_the_share_of_the_time_since():
    budget = MarkBudget(share=0.01, credit_s=0.002)
    assert budget.allows(100.0)
    budget.spend(0.003)  # one reading dearer than the whole credit
    assert not budget.allows(100.05)  # 0.5 ms earned back: still 0.5 ms short
    assert budget.allows(100.2)  # 2 ms earned back since 100.0: above zero again
    budget.spend(0.001)
    assert budget.allows(100.2)


def test_time_without_marks_saves_up_no_more_than_the_credit():
    budget = MarkBudget(share=0.01, credit_s=0.002)
    assert budget.allows(0.0)
    assert budget.allows(3600.0)  # an hour of evaluation without a mark
    budget.spend(0.0025)  # the credit is 2 ms, not 36 s: one dear reading spends it
    assert not budget.allows(3600.0)


class _Readings:
    """The resident memory a test sets, read by the marks instead of /proc."""

    def __init__(self) -> None:
        self.value = 1000

    def __call__(self, fd: int) -> int:
        return self.value


@pytest.fixture()
def marks(monkeypatch):
    readings = _Readings()
    monkeypatch.setattr(sampler_module, "resident_bytes", readings)
    monkeypatch.setattr(sampler_module, "heap_bytes", lambda: None)
    monkeypatch.setattr(sampler_module, "cuda_allocated", lambda: None)
    sampler = Sampler(lambda fields: None, None)  # never started: marks only
    yield sampler, readings
    os.close(sampler._statm)


USER_CODE = """
def loop(calls):
    for call in calls:
        call()  # one line for every call: this frame is on every stack the marks see


def validation(sampler, readings):  # keeps 4000 bytes
    sampler.mark_memory()
    readings.value += 4000
    sampler.mark_memory()


def training(sampler, readings):
    sampler.mark_memory()


def repeated(sampler, times, between):
    for time in range(times):
        sampler.mark_memory()  # the same frame at the same line every time
        between(time)
"""


def _user_code(sampler: Sampler, readings: _Readings) -> dict:
    """A user's training file (the marks keep only frames of the user's files, and a test
    under tests/nsadiag/ is nsadiag's own)."""
    namespace: dict = {}
    exec(compile(USER_CODE, "/srv/project/train.py", "exec"), namespace)
    return {"loop": namespace["loop"],
            "validation": lambda: namespace["validation"](sampler, readings),
            "training": lambda: namespace["training"](sampler, readings),
            "repeated": lambda times, between=lambda time: None:
                namespace["repeated"](sampler, times, between)}


def _frames_of_last_rise(sampler: Sampler) -> tuple[int, set[str]]:
    low, high, frames, _ = sampler.book.memory["rss"].segments[-1]
    return high - low, {frame[0] for frame in frames}


def test_a_rise_in_a_call_whose_marks_read_nothing_goes_to_the_frames_all_calls_share(marks):
    sampler, readings = marks
    user = _user_code(sampler, readings)

    def over_budget():
        sampler._mark_budget = MarkBudget(share=0.0, credit_s=0.0)

    def within_budget():
        sampler._mark_budget = MarkBudget()

    user["loop"]([user["training"], over_budget, user["validation"], within_budget,
                  user["training"]])
    rose, frames = _frames_of_last_rise(sampler)
    assert rose == 4000
    # read at the training call's mark, after the validation call's marks read nothing:
    # the loop holds it, not the training call (which did not make it)
    assert frames == {"loop"}


def test_marks_within_budget_give_each_rise_to_the_call_that_made_it(marks):
    sampler, readings = marks
    user = _user_code(sampler, readings)
    user["loop"]([user["training"], user["validation"], user["training"]])
    rose, frames = _frames_of_last_rise(sampler)
    assert rose == 4000 and frames == {"loop", "validation"}


def test_an_over_budget_mark_from_a_caller_seen_since_the_last_reading_walks_no_stack(
        marks, monkeypatch):
    sampler, readings = marks
    user = _user_code(sampler, readings)
    walks = []
    walk = sampler_module.user_stack_of
    monkeypatch.setattr(sampler_module, "user_stack_of",
                        lambda frame: walks.append(1) or walk(frame))
    sampler._mark_budget = MarkBudget(share=0.0, credit_s=0.0)
    user["repeated"](5)
    assert len(walks) == 1  # the first narrows; the next four have nothing to narrow
    user["validation"]()  # other callers: each walked once
    assert len(walks) == 3
    sampler._mark_budget = MarkBudget()

    def over_budget_after_the_first(time):
        if time == 0:
            sampler._mark_budget = MarkBudget(share=0.0, credit_s=0.0)

    user["repeated"](4, over_budget_after_the_first)
    assert len(walks) == 4  # the reading walked; the marks after it had seen their caller
