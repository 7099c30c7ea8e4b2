"""The verdict across ranks, the collective counter's summary, the ready-twice explanation
and the Flight Recorder summary, on synthetic fixtures (no processes)."""

from nsadiag.evidence import Evidence, ProcessOutcome
from nsadiag.finding.known_fixes import fixes_for
from nsadiag.harness.collectives import summarize
from nsadiag.probes.flight_recorder import summarize_dump
from nsadiag.verdict import explain_exception
from nsadiag.verdict.ranks import RankEvidence, decide_ranks, divergence

T0 = 1000.0


def coll(n, edge, op="all_reduce", origin="ddp", phase="backward", step=0, t=None,
         status=None, shapes=((100,),)):
    event = {"t": T0 + n if t is None else t, "kind": "collective", "edge": edge, "n": n,
             "op": op, "origin": origin, "phase": phase, "step": step,
             "detail": "DDP bucket 0, 3 tensors" if origin == "ddp" else "1 tensor",
             "shapes": [list(s) for s in shapes] if edge == "start" else []}
    if status:
        event["status"] = status
    return event


def module(name, phase, step, edge="enter", t=T0):
    return {"t": t, "kind": "module", "module": name, "phase": phase, "step": step,
            "edge": edge}


def healthy_step(step, base):
    return [coll(base + 1, "start", step=step), coll(base + 1, "end", step=step, status="ok"),
            coll(base + 2, "start", origin="call", phase="optimizer", step=step,
                 shapes=((1,),)),
            coll(base + 2, "end", origin="call", phase="optimizer", step=step, status="ok")]


def rank(r, collective_events, modules, result=None):
    return RankEvidence(rank=r, pid=100 + r, events=modules + collective_events,
                        event_counts={}, result=result,
                        started=[e for e in collective_events if e["edge"] == "start"],
                        collectives=summarize(collective_events))


def job(kill_reason="stall", exit_code=None):
    outcome = ProcessOutcome(exit_code=exit_code, signal=9 if kill_reason else None,
                             killed_by_runner=bool(kill_reason), kill_reason=kill_reason,
                             wall_s=20.0, ended_at=T0 + 10)
    return Evidence(spec={}, events=[], event_counts={}, result=None, outcome=outcome,
                    stall=None, expected_events_per_step=None, total_steps=3,
                    stall_timeout_s=3.0)


def diverging_ranks():
    """Step 0 alike; in step 1 rank 1 issues an extra all_reduce in forward (#3) while
    rank 0 issues its DDP bucket (#3); neither completes."""
    r0 = healthy_step(0, 0) + [coll(3, "start", step=1, t=T0 + 5)]
    r1 = healthy_step(0, 0) + [coll(3, "start", origin="call", phase="forward", step=1,
                                    t=T0 + 4, shapes=((1,),))]
    return [rank(0, r0, [module("blocks.0", "backward", 1, "exit")]),
            rank(1, r1, [module("blocks.1", "forward", 1)])]


def test_summarize_counts_open_and_completed_collectives():
    events = healthy_step(0, 0) + [coll(3, "start", step=1)]
    summary = summarize(events)
    assert summary["issued"] == 3 and summary["completed"] == 2
    assert [c["n"] for c in summary["open"]] == [3]
    assert summary["last"]["n"] == 3 and summary["failed"] == []


def test_divergence_tie_is_broken_by_the_previous_step():
    split = divergence(diverging_ranks())
    assert split["n"] == 3 and split["odd"] == [1]
    assert "other than in the previous step" in split["why"]


def test_divergence_minority_and_missing_collectives():
    base = healthy_step(0, 0)
    extra = [coll(3, "start", origin="call", phase="forward", step=1, shapes=((1,),))]
    bucket = [coll(3, "start", step=1)]
    three = [rank(0, base + bucket, []), rank(1, base + extra, []), rank(2, base + bucket, [])]
    assert divergence(three)["odd"] == [1]
    behind = [rank(0, base + bucket, []), rank(1, base, [])]
    split = divergence(behind)
    assert split["odd"] == [1] and "never issued collective #3" in split["why"]
    assert divergence([rank(0, base, []), rank(1, base, [])]) is None


def test_stall_names_who_waits_where():
    verdict = decide_ranks(job(), diverging_ranks())
    assert verdict.name == "STALL-COLLECTIVE"
    assert verdict.facts.ranks.odd_ranks == [1] and verdict.facts.ranks.diverged_at == 3
    assert verdict.reasons[0] == (
        "rank 1 waits in all_reduce #3 (1 tensor) for 6.0 s and is in blocks.1 forward of "
        "step 1 / issued 3 collectives; rank 0 waits in all_reduce #3 (DDP bucket 0, 3 "
        "tensors) for 5.0 s and is just after blocks.0 backward of step 1 / issued 3 "
        "collectives")


def test_process_group_timeout_is_a_stall_collective_not_an_error():
    ranks = diverging_ranks()
    timeout = {"type": "RuntimeError", "message": "[gloo/transport/tcp/unbound_buffer.cc:78] "
               "Timed out waiting 5000ms for recv operation to complete", "traceback": ""}
    for r, t in ((0, T0 + 8), (1, T0 + 9)):
        ranks[r].result = {"status": "error", "exception": timeout}
        ranks[r].events.append({"t": t, "kind": "end", "phase": "forward", "step": 1})
    verdict = decide_ranks(job(kill_reason=None, exit_code=1), ranks)
    assert verdict.name == "STALL-COLLECTIVE" and verdict.facts.ranks.pg_timeout is True
    assert verdict.reasons[0].startswith("rank 0 gave up on a collective first")
    assert verdict.facts.ranks.odd_ranks == [1]


def test_the_first_other_exception_decides_with_its_rank():
    ranks = diverging_ranks()
    ranks[1].result = {"status": "error", "exception": {
        "type": "ValueError", "message": "bad batch", "traceback": ""}}
    ranks[1].events.append({"t": T0 + 1, "kind": "end", "phase": "forward", "step": 1})
    ranks[0].result = {"status": "error", "exception": {
        "type": "RuntimeError", "message": "Connection closed by peer", "traceback": ""}}
    ranks[0].events.append({"t": T0 + 2, "kind": "end", "phase": "backward", "step": 1})
    verdict = decide_ranks(job(kill_reason=None, exit_code=1), ranks)
    assert verdict.name == "ERROR" and verdict.facts.ranks.rank == 1
    assert verdict.reasons[0] == "rank 1 raised first: the child raised ValueError: bad batch"


def test_a_rank_that_died_is_the_cause_not_its_peer_that_lost_the_connection():
    ranks = diverging_ranks()
    ranks[0].result = {"status": "error", "exception": {
        "type": "RuntimeError", "message": "Connection closed by peer [127.0.0.1]:4242",
        "traceback": ""}}
    ranks[0].events.append({"t": T0 + 6, "kind": "end", "phase": "backward", "step": 1})
    verdict = decide_ranks(job(kill_reason=None, exit_code=1), ranks)  # rank 1: no result
    assert verdict.name == "CRASH" and verdict.facts.ranks.rank == 1
    assert verdict.reasons[0].startswith("rank 1 ended without a result or an exception")
    assert verdict.reasons[1].startswith("rank 0 only lost its connection to it: Connection "
                                         "closed by peer")
    assert "blocks.1 forward" in verdict.reasons[-1]


def test_an_unrelated_timeout_error_is_not_a_collective_stall():
    ranks = diverging_ranks()
    for r in ranks:
        r.result = {"status": "error", "exception": {
            "type": "TimeoutError", "message": "dataset download timeout", "traceback": ""}}
        r.events.append({"t": T0 + 2 + r.rank, "kind": "end", "phase": "forward", "step": 1})
    verdict = decide_ranks(job(kill_reason=None, exit_code=1), ranks)
    assert verdict.name == "ERROR" and verdict.facts.ranks.rank == 0


def test_all_ranks_ok_is_ok_with_counts():
    ranks = [rank(r, healthy_step(0, 0), [], {"status": "ok", "steps_done": 1,
                                               "collectives_issued": 2}) for r in (0, 1)]
    verdict = decide_ranks(job(kill_reason=None, exit_code=0), ranks)
    assert verdict.name == "OK" and verdict.facts.ranks.collectives_issued == {0: 2, 1: 2}
    assert verdict.reasons[1] == "every rank issued 2 collectives"


READY_TWICE = (
    "Expected to mark a variable ready only once. This error is caused by one of the "
    "following reasons: 1) Use of a module parameter outside the `forward` function.\n"
    "Parameter at index 16 with name model.blocks.3.down.bias has been marked as ready "
    "twice. This means that multiple autograd engine  hooks have fired for this particular "
    "parameter during this iteration.")


def test_ready_twice_is_explained_with_the_parameter_and_fixes():
    explained = explain_exception("RuntimeError", READY_TWICE)
    assert explained["parameter"] == "model.blocks.3.down.bias"
    assert "(model.blocks.3.down.bias)" in explained["cause"]
    assert "lambda x: blk(x)" in explained["cause"]
    assert any("functools.partial(checkpoint, blk)" in fix for fix in fixes_for(explained["known"]))
    assert any("use_reentrant=False" in fix for fix in fixes_for(explained["known"]))
    assert explain_exception("RuntimeError", "CUDA error: device-side assert") is None


def test_flight_recorder_dump_summary():
    entries = [{"collective_seq_id": i, "profiling_name": "nccl:all_reduce",
                "state": "completed", "input_sizes": [[10]], "process_group": ["0", "default"]}
               for i in range(1, 10)]
    entries.append({"collective_seq_id": 10, "profiling_name": "nccl:all_reduce",
                    "state": "started", "input_sizes": [[61784]],
                    "process_group": ["0", "default"]})
    summary = summarize_dump({"entries": entries, "version": "2.4"})
    assert summary["entries"] == 10
    assert summary["states"] == {"completed": 9, "started": 1}
    assert summary["unfinished"] == [{"seq": 10, "op": "nccl:all_reduce", "state": "started",
                                      "sizes": [[61784]], "group": "0"}]
    assert [row["seq"] for row in summary["last"]] == [3, 4, 5, 6, 7, 8, 9, 10]
