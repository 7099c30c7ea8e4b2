"""The one builder of a watched run's record (nsadiag.harness.record), on streams and
session ends written by hand: how a process ended, in the verdict's terms and in words;
which process trained and which are ranks; every process's role; and build_record's
evidence and verdict for a run that finished, one stopped at a stall, one whose command
left only a traceback on stderr, and a job of two ranks."""

import json
from pathlib import Path
from typing import Any

from nsadiag.evidence import StackFrame, StackSample, StallEvidence, ThreadStack
from nsadiag.harness.record import (
    build_record,
    command_facts,
    how_it_ended,
    outcome_of,
    rank_streams,
    training_stream,
)
from nsadiag.harness.session import SessionEnd
from nsadiag.harness.streams import Stream

T0 = 2000.0
SPEC = {"target": "nsa", "n_layers": 2, "seq_len": 64, "steps": 2, "stall_timeout_s": 5.0}


def stream(root: Path, name: str, events: list[dict[str, Any]], total_steps: int = 2) -> Stream:
    """A stream that has read ``events`` from proc ``name``'s heartbeat under ``root``."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    read = Stream(name, folder / "events.jsonl", total_steps)
    read.add(events)
    return read


def start(pid: int, rank: int | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    return {"t": T0, "seq": 0, "kind": "start", "phase": "build", "pid": pid, "rank": rank,
            "argv": argv or ["python", "train.py"]}


def blocks(step: int, t: float, phase: str = "forward", module: str = "blocks.0",
           edges: tuple[str, ...] = ("enter", "exit")) -> list[dict[str, Any]]:
    """Block events from time ``t``, numbered in the heartbeat's order by their time."""
    return [{"t": t + i * 0.1, "seq": round(10 * (t - T0)) + i, "kind": "module", "phase": phase,
             "step": step, "module": module, "edge": edge} for i, edge in enumerate(edges)]


def two_steps(pid: int, rank: int | None = None) -> list[dict[str, Any]]:
    return [start(pid, rank), *blocks(0, T0 + 1), {"t": T0 + 2, "kind": "step", "step": 0},
            *blocks(1, T0 + 3), {"t": T0 + 4, "kind": "step", "step": 1},
            {"t": T0 + 4.5, "kind": "end"}]


def end_of(streams: list[Stream], stalls: dict[str, StallEvidence] | None = None,
           others: list[dict[str, Any]] | None = None) -> SessionEnd:
    return SessionEnd(due=None, started=T0, ended_at=T0 + 5, streams=streams, load={},
                      stalls=stalls or {}, others=others or [])


def lock_wait_stall(samples: int = 3) -> StallEvidence:
    frames = [StackFrame("acquire", "/home/user/project/model.py", 31,
                         code="self._inner.acquire()"),
              StackFrame("forward", "/home/user/project/model.py", 71)]
    return StallEvidence(since_last_event_s=5.0, window_s=5.0, cpu_delta_s=0.0,
                         samples=[StackSample(T0 + 9 + i, 321,
                                              [ThreadStack(1, "MainThread", frames)])
                                  for i in range(samples)])


def test_a_signal_is_said_as_the_rules_read_it_and_in_words():
    killed = outcome_of(-9, "stall", wall_s=12.0, ended_at=T0)
    assert (killed.exit_code, killed.signal, killed.signal_name) == (None, 9, "SIGKILL")
    assert killed.killed_by_runner and killed.kill_reason == "stall"
    assert how_it_ended(killed) == "stopped by nsadiag at a stall"
    died = outcome_of(-6, None, wall_s=3.0, ended_at=T0, oom_killer=True)
    assert not died.killed_by_runner and died.oom_killer
    assert how_it_ended(died) == "killed by SIGABRT"
    # the OOM killer is only the kernel's when nsadiag did not stop the process itself
    assert not outcome_of(-9, "budget", 3.0, T0, oom_killer=True).oom_killer
    assert how_it_ended(outcome_of(-9, "budget", 3.0, T0)) == "stopped by nsadiag at the deadline"
    exited = outcome_of(3, None, wall_s=1.0, ended_at=T0, cap=2**30)
    assert (exited.exit_code, exited.signal, exited.memory_cap_bytes) == (3, None, 2**30)
    assert how_it_ended(exited) == "exit code 3"


def test_the_process_that_trained_is_the_busiest_and_each_rank_keeps_its_busiest(tmp_path):
    launcher = stream(tmp_path, "proc-0", [start(10, argv=["torchrun", "--nproc", "2"])])
    rank0 = stream(tmp_path, "proc-1", two_steps(11, rank=0))
    rank0_echo = stream(tmp_path, "proc-2", [start(12, rank=0)])
    rank1 = stream(tmp_path, "proc-3", [start(13, rank=1), *blocks(0, T0 + 1)])
    streams = [launcher, rank0, rank0_echo, rank1]
    assert training_stream(streams) is rank0
    assert rank_streams(streams) == {0: rank0, 1: rank1}
    assert training_stream([]) is None


def test_every_process_of_a_command_has_its_role_and_place(tmp_path):
    launcher = stream(tmp_path, "proc-0", [start(10, argv=["/usr/bin/torchrun", "train.py"])])
    trainer = stream(tmp_path, "proc-1", two_steps(11))
    helper = stream(tmp_path, "proc-2", [start(12)])
    worker = {"pid": 77, "role": "DataLoader worker 0", "stall": lock_wait_stall(1).to_dict()}
    end = end_of([launcher, trainer, helper], stalls={"proc-1": lock_wait_stall()},
                 others=[worker])
    facts = command_facts(end, trainer, outcome_of(0, None, 5.0, T0 + 5))
    roles = {p["name"]: p["role"] for p in facts.processes}
    assert roles == {"proc-0": "the torchrun launcher", "proc-1": "the training process",
                     "proc-2": "a watched process", "pid-77": "DataLoader worker 0"}
    assert facts.main_process == "proc-1"
    assert (facts.exit_code, facts.ended) == (0, "exit code 0")
    places = {p["name"]: p["place"] for p in facts.processes}
    assert places["proc-2"] is None  # not sampled at the stop
    assert "model.py:31" in places["proc-1"] and "model.py:31" in places["pid-77"]


def test_a_run_that_finished_is_ok_and_its_evidence_is_written_beside_it(tmp_path):
    main = stream(tmp_path, "proc-0", two_steps(11))
    record = build_record(SPEC, tmp_path, end_of([main]), main, {},
                          outcome_of(0, None, 5.0, T0 + 5), ended_ok=True, total_steps=2)
    assert record.verdict.name == "OK"
    assert record.verdict.reasons[0] == ("the child finished 2 of 2 steps with status ok and "
                                         "exit code 0 in 5.0 s")
    # no result.json: the whole run ended well, so the process is ok with its counted steps
    assert record.evidence.result == {"status": "ok", "steps_done": 2, "collectives_issued": 0}
    assert record.evidence.event_counts == {"start": 1, "module": 4, "step": 2, "end": 1}
    assert record.trial_dir == str(tmp_path) and record.wall_s == 5.0
    stored = json.loads((tmp_path / "evidence.json").read_text())
    assert stored == json.loads(json.dumps(record.evidence.to_dict()))


def test_a_result_the_process_wrote_is_taken_over_the_counted_steps(tmp_path):
    main = stream(tmp_path, "proc-0", two_steps(11))
    written = {"status": "ok", "steps_done": 2, "expected_events_per_step": 2, "pid": 11}
    (tmp_path / "proc-0" / "result.json").write_text(json.dumps(written))
    record = build_record(SPEC, tmp_path, end_of([main]), main, {},
                          outcome_of(0, None, 5.0, T0 + 5), ended_ok=True, total_steps=2)
    assert record.evidence.result == written
    assert record.evidence.expected_events_per_step == 2


def test_a_run_stopped_at_a_stall_is_classified_with_its_open_backward(tmp_path):
    events = [start(11), *blocks(0, T0 + 1),
              {"t": T0 + 2, "seq": 20, "kind": "start", "phase": "backward", "step": 0},
              *blocks(0, T0 + 3, "backward", "blocks.1", ("enter",)),
              *blocks(0, T0 + 4, "backward", "blocks.0", ("enter",))]
    main = stream(tmp_path, "proc-0", events)
    end = end_of([main], stalls={"proc-0": lock_wait_stall()})
    record = build_record(SPEC, tmp_path, end, main, {},
                          outcome_of(-9, "stall", 10.0, T0 + 10), ended_ok=False,
                          total_steps=2)
    assert record.verdict.name == "DEADLOCK"
    assert "MainThread is blocked in acquire (model.py:31) `self._inner.acquire()`" \
        in record.verdict.reasons
    # the modules whose backward began and never ended, the latest started first
    assert record.evidence.stall.unfinished_backward == ["blocks.0", "blocks.1"]
    assert record.evidence.result is None


def test_a_command_that_left_only_a_traceback_is_an_error_with_that_exception(tmp_path):
    main = stream(tmp_path, "proc-0", [start(11), *blocks(0, T0 + 1)])
    fallback = {"type": "ValueError", "message": "shapes (3,) and (4,) do not match",
                "traceback": 'Traceback (most recent call last):\n  File '
                             '"/home/user/project/train.py", line 12, in main\n'
                             '    loss = model(x)\nValueError: shapes (3,) and (4,) do not match'}
    spec = {**SPEC, "command": ["python", "train.py"], "subject": "the command"}
    record = build_record(spec, tmp_path, end_of([main]), main, {},
                          outcome_of(1, None, 2.0, T0 + 2), ended_ok=False, total_steps=0,
                          fallback=fallback)
    assert record.evidence.result == {"status": "error", "exception": fallback}
    assert record.verdict.name == "ERROR"
    assert record.verdict.reasons[:2] == [
        "the command raised ValueError: shapes (3,) and (4,) do not match",
        "innermost project frame: /home/user/project/train.py:12 in main"]


def test_a_job_of_two_ranks_is_decided_across_them_with_each_ranks_evidence(tmp_path):
    rank0 = stream(tmp_path, "proc-0", two_steps(11, rank=0))
    rank1 = stream(tmp_path, "proc-1", two_steps(12, rank=1))
    record = build_record(SPEC, tmp_path, end_of([rank0, rank1]), rank0,
                          {0: rank0, 1: rank1}, outcome_of(0, None, 5.0, T0 + 5),
                          ended_ok=True, total_steps=2)
    assert record.verdict.name == "OK"
    assert [(r["rank"], r["pid"]) for r in record.evidence.ranks] == [(0, 11), (1, 12)]
    single = build_record(SPEC, tmp_path, end_of([rank0]), rank0, {0: rank0},
                          outcome_of(0, None, 5.0, T0 + 5), ended_ok=True, total_steps=2)
    assert single.evidence.ranks is None  # one rank is decided as one process
