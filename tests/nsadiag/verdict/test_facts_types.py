"""A verdict's typed facts (nsadiag.verdictfacts): each family read from facts a real run
stored (the committed reports' summaries, the verdict fixtures' decisions) and written back
as the same JSON; a value of the wrong type is one schema error where the record is read; a
record written before the facts were typed reads back unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsadiag.evidence import Evidence
from nsadiag.rundir import RecordError, TrialRecord
from nsadiag.schema import errors
from nsadiag.verdict import decide
from nsadiag.verdict.names import Verdict
from nsadiag.verdictfacts import FactsError, VerdictFacts, family_of
from tests.helpers import VERDICT_FIXTURES

REPO = Path(__file__).resolve().parents[3]


def stored_facts(report: str) -> dict:
    """The failing verdict's facts of a committed report's summary.json."""
    summary = json.loads((REPO / "reports" / report / "summary.json").read_text())
    return summary["failing"]["facts"]


def decided_facts(fixture: str) -> dict:
    """The JSON facts of the verdict the rules decide on a recorded evidence fixture."""
    evidence = Evidence.from_dict(json.loads((VERDICT_FIXTURES / fixture).read_text()))
    return json.loads(json.dumps(decide(evidence).to_dict()))["facts"]


def recorded(data: dict) -> dict:
    """``data`` as to_dict writes it: facts not recorded (None) left out."""
    return {key: value for key, value in data.items() if value is not None}


# (where the facts come from, the family they must fill, a reader's attribute and its value)
FAMILIES = {
    "slow": (lambda: stored_facts("run-slow-script"),
             lambda f: (f.slow.fraction_basis, f.position.load.contended, f.hot.hot_source),
             ("steps and in-step position", True, "profile")),
    "stall": (lambda: stored_facts("sweep-deadlock"),
              lambda f: (isinstance(f.stall.stacks_changed, bool),
                         f.position.confidence is not None),
              (True, True)),
    "ranks": (lambda: stored_facts("ddp-stall"),
              lambda f: (f.ranks.odd_ranks, [row.rank for row in f.ranks.ranks],
                         f.ranks.ranks[1].position, f.stall.wait_chain.end,
                         f.stall.wait_chain.hops[0].kind),
              ([1], [0, 1], "in blocks.1 forward of step 1", "collective-differs",
               "collective")),
    "memory": (lambda: decided_facts("oom_exception.json"),
               lambda f: (f.memory.peak_rss > 0, f.crash.exception_type),
               (True, "torch.OutOfMemoryError")),
    "crash": (lambda: decided_facts("sigsegv.json"),
              lambda f: (f.crash.signal, f.crash.signal_name, f.position.last_module),
              (11, "SIGSEGV", "blocks.1.attn.sel")),
    "check": (lambda: stored_facts("check-ckpt"),
              lambda f: (f.check.check, f.check.figures["recomputed_calls"] > 0),
              ("ckpt", True)),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_reads_its_stored_facts_and_writes_back_the_same_json(family):
    read, attributes, expected = FAMILIES[family]
    data = read()
    facts = VerdictFacts.from_dict(data)
    assert attributes(facts) == expected
    assert any(family_of(key) == family for key in data)
    assert json.dumps(facts.to_dict()) == json.dumps(recorded(data))  # same keys, same order
    assert VerdictFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts


def test_a_rules_dict_is_parsed_once_into_the_verdict():
    verdict = Verdict("SLOW", ["slow"], {"rate": 2, "slow_by": "defect", "eta_s": None})
    assert isinstance(verdict.facts, VerdictFacts)
    assert verdict.facts.slow.rate == 2 and verdict.facts.slow.slow_by == "defect"
    assert verdict.to_dict()["facts"] == {"rate": 2, "slow_by": "defect"}
    assert not VerdictFacts() and verdict.facts


def test_a_key_no_family_has_is_an_error_from_a_rule_and_left_out_of_a_stored_record():
    with pytest.raises(FactsError, match="facts.next_step: not a fact of any family"):
        VerdictFacts.of({"rate": 1.0, "next_step": "give the job more time"})
    stored = VerdictFacts.from_dict({"rate": 1.0, "next_step": "give the job more time"})
    assert stored.to_dict() == {"rate": 1.0}


@pytest.mark.parametrize(("facts", "named"), [
    ({"rate": "fast"}, "facts.rate: 'fast' is not of type float | None"),
    ({"slow_by": 3}, "facts.slow_by: 3 is not of type str | None"),
    ({"steps_done": True}, "facts.steps_done: True is not of type"),
    ({"load": {"load_per_cpu": "busy", "contended": True}}, "facts.load.load_per_cpu: 'busy'"),
    ({"ranks": [{"rank": "zero"}]}, "facts.ranks[0].rank: 'zero' is not of type int | None"),
    ({"wait_chain": ["not", "an", "object"]}, "facts.wait_chain: ['not', 'an', 'object']"),
])
def test_a_value_of_the_wrong_type_is_one_schema_error_where_the_record_is_read(facts, named):
    line = json.loads((REPO / "reports" / "sweep-layers-cuda" / "trials.jsonl")
                      .read_text().splitlines()[0])
    line["verdict"]["facts"] = facts
    with pytest.raises(RecordError) as raised:
        TrialRecord.from_dict(line)
    said = str(raised.value)
    assert said.startswith("not a trial record (facts.") and named in said
    assert "\n" not in said


def test_a_record_written_before_the_facts_were_typed_reads_back_the_same():
    for line in (REPO / "reports" / "sweep-layers-cuda" / "trials.jsonl").read_text() \
            .splitlines():
        stored = json.loads(line)
        record = TrialRecord.from_dict(stored)
        assert record.facts.position.steps_done == stored["verdict"]["facts"]["steps_done"]
        assert record.facts.memory.peak_rss == stored["verdict"]["facts"]["peak_rss"]
        assert json.dumps(record.to_dict()) == json.dumps(stored)
        assert errors(record.to_dict(), "trial") == []
    for report in ("run-slow-script", "sweep-deadlock", "ddp-stall", "sweep-slow",
                   "triage-per-token-loop", "check-ckpt"):
        failing = json.loads((REPO / "reports" / report / "summary.json").read_text())["failing"]
        again = Verdict.from_dict(failing).to_dict()
        assert again == {**failing, "facts": recorded(failing["facts"])}, report
