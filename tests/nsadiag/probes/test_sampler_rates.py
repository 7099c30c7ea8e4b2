"""What the sampler and the memory marks skip to keep their cost down: the profile's writes
while the process progresses (never a stall's), the frames between a hook and the user
frame its mark found at that depth before."""

from __future__ import annotations

import os
import time

import pytest

from nsadiag.probes.sampler import (
    PROFILE_MAX_S,
    PROFILE_S,
    PROFILE_SHARE,
    PULSE_S,
    Sampler,
    innermost_user_frame,
)


@pytest.fixture()
def sampler():
    made = []

    def make(**kwargs) -> Sampler:
        made.append(Sampler(lambda fields: None, None, **kwargs))  # never started
        return made[-1]

    yield make
    for one in made:
        os.close(one._statm)


def test_a_dear_profile_is_written_further_apart_while_the_process_progresses(sampler):
    watching = sampler()
    watching._last_progress = time.monotonic()
    assert watching._profile_gap(0.0005) == PROFILE_S  # a cheap write: every PROFILE_S
    assert watching._profile_gap(0.006) == pytest.approx(0.006 / PROFILE_SHARE)
    assert watching._profile_gap(1.0) == PROFILE_MAX_S
    watching._last_progress = time.monotonic() - 3 * PULSE_S  # nothing moved: a stall
    assert watching._profile_gap(1.0) == PROFILE_S  # its profile stays fresh


LIBRARY = """
def find(hint):
    return innermost_user_frame(hint)


def through(levels, hint):
    if levels == 0:
        return find(hint)
    return through(levels - 1, hint)
"""

USER = """
def user_calls(hint, library):
    return library["through"](3, hint)


def outer(hint, library, inner):
    return library["through"](1, lambda: inner(hint, library))


def inner(hint, library):
    return library["through"](0, hint)
"""


def _code(source: str, path: str, **names) -> dict:
    namespace: dict = dict(names)
    exec(compile(source, path, "exec"), namespace)
    return namespace


def test_a_hook_mark_finds_the_user_frame_at_the_depth_it_found_it_at_before():
    library = _code(LIBRARY, "/opt/venv/lib/python3.11/site-packages/hooks.py",
                    innermost_user_frame=innermost_user_frame)
    user = _code(USER, "/srv/project/train.py")
    # through(0) calls find, so through(0) .. through(3) are depths 0 to 3
    frame, depth = user["user_calls"](0, library)
    assert (frame.f_code.co_name, depth) == ("user_calls", 4)
    for hint in (4, 2, 100):  # right; a library frame; deeper than the stack
        frame, depth = user["user_calls"](hint, library)
        assert (frame.f_code.co_name, depth) == ("user_calls", 4)


def test_a_hinted_user_frame_with_another_inside_it_is_taken_as_the_innermost():
    """The frames from the one taken outward are a part of the true stack: the marks
    narrow to them, less precise and never another call's (``innermost_user_frame``)."""
    library = _code(LIBRARY.replace("return find(hint)", "return hint() if callable(hint) "
                                    "else find(hint)"),
                    "/opt/venv/lib/python3.11/site-packages/hooks.py",
                    innermost_user_frame=innermost_user_frame)
    user = _code(USER, "/srv/project/train.py")
    frame, depth = user["inner"](0, library)
    assert (frame.f_code.co_name, depth) == ("inner", 1)
    # from find's caller out: through(0) 0, inner 1, <lambda> 2, through(0) 3, through(1) 4,
    # outer 5
    for hint in (0, 1, 3):  # a walk, the innermost, a library frame (then a walk)
        frame, depth = user["outer"](hint, library, user["inner"])
        assert (frame.f_code.co_name, depth) == ("inner", 1)
    for hint, name in ((2, "<lambda>"), (5, "outer")):  # user frames with one inside
        frame, depth = user["outer"](hint, library, user["inner"])
        assert (frame.f_code.co_name, depth) == (name, hint)
