"""nsadiag env --self-test compares diagnosed verdicts with the zoo's expectations."""

from nsadiag.commands import selftest
from repro import ZOO


def test_self_test_rows_match_the_zoo():
    rows = selftest.self_test(only=["backward_error", "hard_crash"])
    assert [(r["entry"], r["expected"], r["got"], r["match"]) for r in rows] == [
        ("backward_error", "ERROR", "ERROR", True), ("hard_crash", "CRASH", "CRASH", True)]


def test_a_wrong_expectation_is_reported_as_a_miss(monkeypatch):
    monkeypatch.setattr(selftest, "ZOO", {"hard_crash": ("OK", ZOO["hard_crash"][1])})
    (row,) = selftest.self_test()
    assert row["got"] == "CRASH" and not row["match"]
    assert "SIGSEGV" in row["reason"]
