"""Redaction costs time linear in its input: a 1 MiB line of the shapes that made it
quadratic (an exception message of dash-joined numbers, "a." repeated, one long line of
stdout; 128 KiB for the other shapes that were) costs per byte no more than a bounded
multiple of what a 1 KiB line of the same shape costs. CPU time of this process, the least
of a few rounds, so that other work on the machine does not count: a ratio, never a wall
time."""

from __future__ import annotations

import time

import pytest

from nsadiag.redact import Redactor

SHORT, LONG = 1 << 10, 1 << 20
MAX_RATIO = 20
"""Measured on the 2-core development machine at load 3-7: 0.9-1.9 for every shape (a
quadratic cost gives about 1000: the long line is 1024 times the short one)."""
SHAPES = {
    "dash-joined numbers": "-".join(str(i) for i in range(200_000)),
    "a. repeated": "a." * (LONG // 2),
    "one stdout line": "step 12/500 loss=3.2514 lr=3e-4 tok/s 1234.5 | " * (LONG // 40),
}
MORE_SHAPES = ("token='", "'token': '", "a:b@", "fe80:", "--token ", "x.internal.", "a=",
               "token%3D", "http://a", "1.2.", "KeyError: ", "-----BEGIN PRIVATE KEY-----")
"""Every other shape that, unanchored, made a pattern re-read the rest of its line."""


def _per_byte(redactor: Redactor, text: str, rounds: int) -> float:
    """The least CPU time per byte of redacting ``text`` over ``rounds`` rounds (a short
    text is redacted many times per round, so the clock's resolution does not count)."""
    repeat = max(1, (32 * SHORT) // len(text))
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(repeat):
            redactor.text(text)
        best = min(best, (time.process_time() - started) / repeat)
    return best / len(text)


def _assert_linear(redactor: Redactor, text: str, long: int, shape: str) -> None:
    """The first ``long`` characters of ``text`` against its first SHORT ones, measured
    again once when over the bound (a burst of other work during one round)."""
    for _ in range(2):
        ratio = _per_byte(redactor, text[:long], 1) / _per_byte(redactor, text[:SHORT], 3)
        if ratio < MAX_RATIO:
            return
    raise AssertionError(f"{shape!r}: {ratio:.1f} times the per-byte cost of a short line")


@pytest.fixture(scope="module")
def redactor():
    return Redactor(hosts={"trainbox-42"}, users={"zed-analyst"}, secrets={"plantedvalue"})


@pytest.mark.parametrize("shape", SHAPES)
def test_a_mebibyte_line_costs_per_byte_what_a_kibibyte_line_costs(redactor, shape):
    text = SHAPES[shape]
    _assert_linear(redactor, text, LONG, shape)


@pytest.mark.parametrize("unit", MORE_SHAPES)
def test_no_pattern_rereads_a_line(redactor, unit):
    _assert_linear(redactor, unit * (LONG // 8 // len(unit) + 1), LONG // 8, unit)
