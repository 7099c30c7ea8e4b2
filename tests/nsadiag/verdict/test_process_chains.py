"""The families of waits across processes from evidence written out by hand: a
multiprocessing queue followed into the child that would put on it
(nsadiag.verdict.waits.process_queues), a producer that ended named with its exit status,
none at all unknown, multiprocessing's own helper processes never taken for the producer,
and a forked copy waiting inside one of torch's ops blamed on the thread pool the fork did
not copy (nsadiag.verdict.waits.forked_pools)."""

from __future__ import annotations

from nsadiag.evidence import StackSample, StallEvidence
from nsadiag.finding.next_step import chain_next
from nsadiag.probes.waits import ProcessWaits, ThreadWait
from nsadiag.verdict.chain import wait_chain
from nsadiag.waitfacts import EndedProcess
from tests.nsadiag.verdict.test_wait_chain import evidence, frame, roundtrip, thread

MP = "/usr/lib/python3.11/multiprocessing/"
LINEAR = "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py"
COMMAND = ("python", "train.py")
TRACKER = ("python", "-c", "from multiprocessing.resource_tracker import main;main(13)")


def _parent_at_get():
    return thread(100, "MainThread", frame("_poll", 440, "r = wait([self], timeout)",
                                           MP + "connection.py"),
                  frame("Queue.get", 113, "if not self._poll(timeout):", MP + "queues.py"),
                  frame("main", 26, 'print("eval", q.get(timeout=60))'))


def _forked_child(pid: int = 200) -> dict:
    child = thread(pid, "MainThread", frame("Linear.forward", 134,
                                            "return F.linear(input, self.weight, self.bias)",
                                            LINEAR),
                   frame("evaluate", 11, "out = model(x)"),
                   frame("Popen._launch", 71, "code = process_obj._bootstrap()",
                         MP + "popen_fork.py"))
    waits = ProcessWaits(pid, COMMAND, threads=(ThreadWait(pid, "futex_do_wait"),))
    return {"pid": pid, "role": "a helper process", "stall": StallEvidence(
        6.0, 2.0, 0.0, samples=[StackSample(1.0, pid, [child])], waits=waits).to_dict()}


def test_a_process_queue_is_followed_into_the_forked_child_and_its_lost_thread_pool():
    waits = ProcessWaits(100, COMMAND, threads=(ThreadWait(100, "poll_schedule_timeout"),),
                         children=(ProcessWaits(200, COMMAND),))
    chain = roundtrip(wait_chain(evidence([_parent_at_get()], waits,
                                          others=[_forked_child()])))
    assert chain.end == "fork-thread-pool"
    assert chain.printed() == (
        "the main thread waits for an item from the multiprocessing queue `q` at train.py:26 "
        "-> in pid 200 (forked from this process, no exec), the main thread waits inside "
        "torch's Linear.forward (linear.py:134), called at train.py:11 `out = model(x)` -> "
        "pid 200 was forked without an exec: torch's intra-op thread pool is not copied by "
        "a fork, and the op waits for pool threads the copy does not have")
    said = chain_next(chain)
    assert "torch.set_num_threads(1)` in the child before its first op at train.py:11" in said
    assert 'multiprocessing.get_context("spawn")' in said


def test_a_spawned_child_in_the_same_op_is_not_blamed_on_a_fork():
    spawned = _forked_child()
    stall = StallEvidence.from_dict(spawned["stall"])
    frames = stall.samples[-1].threads[0].frames
    del frames[-1]  # no Popen._launch: a spawned child runs its own command
    spawned["stall"] = stall.to_dict()
    waits = ProcessWaits(100, COMMAND, threads=(ThreadWait(100, "poll_schedule_timeout"),),
                         children=(ProcessWaits(200, ("python", "-c", "spawn_main()")),))
    chain = roundtrip(wait_chain(evidence([_parent_at_get()], waits, others=[spawned])))
    assert chain.end != "fork-thread-pool" and "forked" not in chain.printed()


def test_a_producer_that_ended_is_named_and_the_resource_tracker_is_not_it():
    waits = ProcessWaits(100, COMMAND, threads=(ThreadWait(100, "poll_schedule_timeout"),),
                         children=(ProcessWaits(300, TRACKER),),
                         ended=(EndedProcess(250, "Process-1", 1),))
    chain = roundtrip(wait_chain(evidence([_parent_at_get()], waits)))
    assert chain.end == "queue-producer-ended" and chain.subject == "pid 250"
    assert chain.hops[-1].text == ("no child of this process is alive to put on it: pid 250 "
                                   "(`Process-1`) ended (exited with code 1)")
    said = chain_next(chain)
    assert said.startswith("Find why pid 250 ended before it put its result")
    assert "`q.get(timeout=...)`" in said and "`p.exitcode` at train.py:26" in said


def test_a_process_queue_with_no_child_at_all_has_an_unknown_producer_not_a_thread():
    waits = ProcessWaits(100, COMMAND, threads=(ThreadWait(100, "poll_schedule_timeout"),))
    chain = roundtrip(wait_chain(evidence([_parent_at_get()], waits)))
    assert chain.end == "unknown" and "thread" not in chain.hops[-1].text
    assert chain_next(chain) is None
