"""nsadiag.fmt: every unit printed one way, the strings reports and reasons carry."""

import math

import pytest

from nsadiag import fmt
from nsadiag.evidence import StallEvidence, cpu_fraction
from nsadiag.finding import numbers


@pytest.mark.parametrize(("value", "text"), [
    (0.00042, "0.00042"), (3.54, "3.5"), (1234, "1,200"), (0, "0"), (math.inf, "inf"),
    (-0.0371, "-0.037")])
def test_sig_keeps_two_significant_digits_without_an_exponent(value, text):
    assert fmt.sig(value) == text


def test_counts_shares_and_si_prefixes():
    assert fmt.count(1028.6) == "1,029"
    assert (fmt.share(0.25), fmt.share(0.0042), fmt.share(0)) == ("25%", "0.42%", "0%")
    assert (fmt.si(7600, "FLOP"), fmt.si(1.5e6, "FLOP"), fmt.si(12)) == \
        ("7.6 kFLOP", "1.5 MFLOP", "12")


@pytest.mark.parametrize(("seconds", "text", "rounded", "clock"), [
    (0.4, "0.40 s", "under a second", "0:00"),
    (40, "40 s", "40 s", "0:40"),
    (100, "100 s", "2 min", "1:40"),
    (720, "12 min", "12 min", "12:00"),
    (5400, "1.5 h", "1.5 h", "1:30:00"),
    (7560, "2.1 h", "2.1 h", "2:06:00")])
def test_durations_in_a_sentence_as_an_estimate_and_on_a_clock(seconds, text, rounded, clock):
    assert fmt.duration(seconds) == text
    assert fmt.rounded_duration(seconds) == rounded
    assert fmt.clock(seconds) == clock


def test_a_seconds_cell_has_two_decimals_and_a_dash_for_nothing():
    assert [fmt.seconds_cell(v) for v in (0.254, None, math.nan)] == ["0.25", "-", "-"]


@pytest.mark.parametrize(("value", "size", "cell"), [
    (512, "512 B", "0 KiB"),
    (3 * 2**10, "3.00 KiB", "3 KiB"),
    (150 * 2**20, "150 MiB", "150 MiB"),
    (1.5 * 2**30, "1.50 GiB", "1.50 GiB")])
def test_bytes_in_a_sentence_and_in_a_table_cell(value, size, cell):
    assert fmt.size(value) == size
    assert fmt.bytes_cell(value) == cell


def test_bytes_in_a_fixed_unit_as_reasons_and_refusals_quote_them():
    assert fmt.gib(3 * 2**29) == "1.50 GiB" and fmt.gib(3 * 2**29, ".3g") == "1.5 GiB"
    assert fmt.mib(1536 * 2**20) == "1,536.0 MiB" and fmt.mib(1536 * 2**20, ".1f") == \
        "1536.0 MiB"
    assert fmt.in_unit(2**20, "KiB", ".0f") == "1024 KiB"
    assert [fmt.bytes_cell(v) for v in (None, math.nan)] == ["-", "-"]


def test_the_findings_numbers_are_the_same_functions():
    assert numbers.sig is fmt.sig and numbers.size is fmt.size
    assert numbers.duration is fmt.duration and numbers.share is fmt.share


def test_the_cpu_fraction_of_a_stored_stall_is_the_evidences():
    stall = StallEvidence(since_last_event_s=30.0, window_s=8.0, cpu_delta_s=2.0)
    assert cpu_fraction(2.0, 8.0) == stall.cpu_fraction() == 0.25
    assert cpu_fraction(None, 8.0) is None and cpu_fraction(2.0, 0.0) is None
    assert cpu_fraction(2.0, None) is None
