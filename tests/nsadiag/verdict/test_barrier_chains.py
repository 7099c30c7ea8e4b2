"""The barriers family (nsadiag.verdict.waits.barriers) from evidence written out by hand:
the threads at the barrier counted, a party that died named, a live thread elsewhere named
as the missing party, and a plain Condition.wait left to the queues family."""

from __future__ import annotations

from nsadiag.finding.next_step import chain_next
from nsadiag.probes.waits import ProcessWaits
from nsadiag.verdict.chain import wait_chain
from tests.nsadiag.verdict.test_wait_chain import evidence, frame, roundtrip, thread

THREADING = "/usr/lib/python3.11/threading.py"


def _at_barrier(tid: int, name: str, line: int, function: str = "Barrier.wait"):
    return thread(tid, name, frame("Condition.wait", 327, "waiter.acquire()", THREADING),
                  frame("Barrier._wait", 732, "if not self._cond.wait_for(...):", THREADING),
                  frame(function, 697, "self._wait(timeout)", THREADING),
                  frame("main" if name == "MainThread" else "load", line,
                        "epoch_start.wait()"))


def test_every_live_thread_at_the_barrier_is_a_barrier_built_for_more_parties():
    threads = [_at_barrier(100, "MainThread", 27), _at_barrier(101, "loader-a", 16),
               _at_barrier(102, "loader-b", 16)]
    chain = roundtrip(wait_chain(evidence(threads, ProcessWaits(100, ()))))
    assert chain.end == "barrier-short" and chain.subject == "epoch_start"
    assert chain.printed() == (
        "the main thread waits at the barrier `epoch_start` at train.py:27 -> 3 threads wait "
        "at `epoch_start` (main thread at train.py:27; thread loader-a at train.py:16; thread "
        "loader-b at train.py:16) and no other live thread of the process is left to arrive: "
        "the barrier was built for more parties than call `wait()`")
    said = chain_next(chain)
    assert said.startswith("Every live thread waits at `epoch_start` (the wait at "
                           "train.py:27) and none is left to arrive")
    assert "BrokenBarrierError" in said and "feeds" not in said


def test_a_party_that_died_of_an_exception_is_named_with_it():
    threads = [_at_barrier(100, "MainThread", 27), _at_barrier(101, "loader-a", 16)]
    died = [{"thread": "loader-c", "type": "FileNotFoundError", "message": "c.bin",
             "where": "load (train.py:13)"}]
    chain = roundtrip(wait_chain(evidence(threads, ProcessWaits(100, ()), died=died)))
    assert chain.end == "barrier-party-died"
    assert chain.hops[-1].text == ("thread loader-c died of FileNotFoundError: c.bin at load "
                                   "(train.py:13), a party that never arrives")
    assert chain.hops[-1].where == "train.py:13"
    said = chain_next(chain)
    assert said.startswith("Fix the exception that ended the thread the chain names at "
                           "train.py:13, a party of `epoch_start` that never arrives")
    assert "`epoch_start.abort()` in a `finally`" in said


def test_a_live_thread_elsewhere_is_the_missing_party_and_py_spys_bare_names_count():
    checksum = thread(103, "checksum", frame("checksum", 15, "total = (total + 1) % 7"))
    threads = [_at_barrier(100, "MainThread", 27, function="wait"),
               _at_barrier(101, "loader-a", 16, function="wait"), checksum]
    chain = roundtrip(wait_chain(evidence(threads, ProcessWaits(100, ()))))
    assert chain.end == "barrier-missing"
    assert chain.hops[-1].text.endswith("one of which must arrive: thread checksum runs "
                                        "train.py:15 `total = (total + 1) % 7`")
    assert chain.hops[-1].where == "train.py:15"
    said = chain_next(chain)
    assert "`epoch_start.abort()`" in said and "train.py:15" in said


def test_an_event_wait_is_not_a_barrier():
    event = thread(100, "MainThread", frame("Condition.wait", 327, "waiter.acquire()",
                                            THREADING),
                   frame("Event.wait", 629, "signaled = self._cond.wait(timeout)", THREADING),
                   frame("main", 40, "ready.wait()"))
    chain = roundtrip(wait_chain(evidence([event], ProcessWaits(100, ()))))
    assert chain.end == "no-producer" and chain.subject == "ready"
