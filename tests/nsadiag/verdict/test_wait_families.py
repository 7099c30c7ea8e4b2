"""The registry of wait families (nsadiag.verdict.waits): every family defined is asked,
every end is owned by exactly one family and means something, every end's advice is a
sentence except where the end names no cause, and the walk asks the families in order."""

from __future__ import annotations

import importlib
import pkgutil

import nsadiag.verdict.waits as waits
from nsadiag.verdict.waits import ENDS, FAMILIES, OWNERS, advice, end_of
from nsadiag.verdict.waits.model import Family, Hop, WaitChain
from tests.nsadiag.finding.test_next_claims import CHAINS

NO_CAUSE = {"unknown", "collective-differs"}
"""Ends whose chain names no cause of its own: the finding says what it knows, or the
collective verdict's own sentence says it."""


def _defined_families() -> list[Family]:
    found = []
    for module in pkgutil.iter_modules(waits.__path__):
        loaded = importlib.import_module(f"{waits.__name__}.{module.name}")
        found += [v for v in vars(loaded).values() if isinstance(v, Family)]
    return found


def test_every_family_a_module_defines_is_in_the_registry_once():
    defined = _defined_families()
    assert len(defined) == len({id(f) for f in defined})
    assert {id(f) for f in defined} == {id(f) for f in FAMILIES}
    assert len(FAMILIES) == len(set(map(id, FAMILIES)))


def test_every_end_is_owned_by_exactly_one_family_and_says_what_it_means():
    owned = [end for family in FAMILIES for end in family.ends]
    assert len(owned) == len(set(owned)) == len(ENDS)
    for end in ENDS:
        assert OWNERS[end].ends[end].meaning.strip(), end
    assert end_of("an end no version wrote") is None


def test_the_family_that_always_answers_is_asked_last():
    assert FAMILIES[-1].name == "unnamed"
    assert "unknown" in FAMILIES[-1].ends


def test_every_end_has_a_sentence_of_advice_unless_it_names_no_cause():
    sample = {chain.end: chain for chain in CHAINS}
    assert set(sample) == set(ENDS)
    silent = {end for end, chain in sample.items() if advice(chain) is None}
    assert silent == NO_CAUSE
    for end, chain in sample.items():
        said = advice(chain)
        assert said is None or said.endswith(".") and len(said.split()) >= 8, (end, said)


def test_a_chain_of_an_end_no_family_owns_gets_no_advice():
    chain = WaitChain((Hop("frame", "the main thread waits at t.py:3", "t.py:3"),),
                      "an end a later version wrote")
    assert advice(chain) is None
