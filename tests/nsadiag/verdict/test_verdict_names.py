"""The verdict names: one str Enum, one failure rule (with INCONCLUSIVE counted where the
triage's depth search asks for it), one set of timing verdicts."""

import json

import pytest

from nsadiag.ci import EXIT_FAILURE, EXIT_HEALTHY, EXIT_INCONCLUSIVE, exit_code
from nsadiag.rundir import TrialRecord
from nsadiag.triage.decide import confidence, reproduced
from nsadiag.triage.engine import chased
from nsadiag.verdict import NAMES, TIMING, Verdict, VerdictName, is_failure


def test_a_name_is_its_string_in_comparisons_json_text_sets_and_dict_keys():
    stall = VerdictName.STALL_BUSY
    assert stall == "STALL-BUSY" and VerdictName("STALL-BUSY") is stall
    assert json.dumps({"name": stall, "seen": [VerdictName.OK]}) == \
        '{"name": "STALL-BUSY", "seen": ["OK"]}'
    assert f"{stall}: {stall:>12}|" == "STALL-BUSY:   STALL-BUSY|" and str(stall) == "STALL-BUSY"
    assert "STALL-BUSY" in {stall} and stall in {"STALL-BUSY"}
    assert {"STALL-BUSY": 3}[stall] == 3
    assert NAMES == ("OK", "SLOW", "INCONCLUSIVE", "STALL-COLLECTIVE", "STALL-BUSY",
                     "DEADLOCK", "OOM", "ERROR", "CRASH", "WRONG")


def test_a_verdict_parses_its_name_and_refuses_an_unknown_one():
    verdict = Verdict("SLOW", ["r"], {"slow_by": "size"})
    assert verdict.name is VerdictName.SLOW
    assert json.loads(json.dumps(verdict.to_dict()))["name"] == "SLOW"
    with pytest.raises(ValueError, match="Verdict.name: 'HANG' is not one of OK, SLOW"):
        Verdict("HANG", [])


@pytest.mark.parametrize("name", NAMES)
def test_failure_and_timing_per_name(name):
    expected_failure = name not in ("OK", "INCONCLUSIVE")
    assert is_failure(name) is expected_failure
    assert is_failure(name, inconclusive_fails=True) is (name != "OK")
    assert VerdictName(name).is_timing is (name in ("SLOW", "STALL-BUSY", "INCONCLUSIVE"))
    assert (name in TIMING) is VerdictName(name).is_timing


def test_a_slow_by_size_is_no_failure_either_way():
    assert not is_failure("SLOW", "size")
    assert not is_failure("SLOW", "size", inconclusive_fails=True)
    assert is_failure("SLOW", "defect") and is_failure("SLOW")


def record(name: str, slow_by: str | None = None) -> TrialRecord:
    facts = {"slow_by": slow_by} if slow_by else {}
    return TrialRecord({"n_layers": 2}, None, Verdict(name, ["r"], facts), "trial-0", 1.0)


def test_a_record_names_its_facts_and_why_it_is_slow():
    assert record("SLOW", "size").slow_by == "size" and record("SLOW").slow_by is None
    assert record("OK").facts.to_dict() == {} and \
        record("SLOW", "defect").facts.to_dict() == {"slow_by": "defect"}
    bare = TrialRecord({}, None, Verdict("OK", []), "trial-0", 1.0)
    assert not bare.facts and bare.slow_by is None


def test_the_triage_chases_an_inconclusive_trial_but_not_a_slow_by_size_one():
    assert chased(record("INCONCLUSIVE")) and chased(record("DEADLOCK"))
    assert chased(record("SLOW", "defect"))
    assert not chased(record("SLOW", "size")) and not chased(record("OK"))


def test_repeats_confirm_a_timing_verdict_only_as_a_failure_but_never_inconclusive():
    assert not reproduced("INCONCLUSIVE", confidence(["INCONCLUSIVE", "INCONCLUSIVE"]))
    assert reproduced("OOM", confidence(["OOM", "OK", "OK"]))


def test_exit_codes_of_verdict_rows_with_their_slow_causes():
    def sweep(*rows):
        return {"command": "sweep-layers", "verdicts": [
            {"verdict": v, "slow_by": s} for v, s in rows]}
    assert exit_code(sweep(("OK", None), ("SLOW", "size"))) == EXIT_HEALTHY
    assert exit_code(sweep(("SLOW", "size"), ("INCONCLUSIVE", None))) == EXIT_INCONCLUSIVE
    assert exit_code(sweep(("SLOW", "defect"), ("INCONCLUSIVE", None))) == EXIT_FAILURE
    assert exit_code({"command": "run", "verdict": "SLOW", "slow_by": "size"}) == EXIT_HEALTHY
    assert exit_code({"command": "run", "verdict": "SLOW"}) == EXIT_FAILURE
