"""`python -m nsadiag.harness.child JOB` running a trial as a real child process: events,
result, errors, limits, dumps.

Every child runs under a timeout and is killed in `finally`, so no process outlives a test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nsadiag.probes.stacks import catches_sigusr1
from nsadiag.spec import JobSpec, TrialSpec
from tests.helpers import REPO
from tests.procs import wait_for

TIMEOUT_S = 120
TINY_NSA = {"dim": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "l": 8, "d": 4,
            "l_sel": 16, "n_sel": 3, "w": 16, "query_chunk": 16, "compress_hidden": 16,
            "vocab_size": 64}
BRANCHES = ("cmp", "sel", "win")


def child_env() -> dict[str, str]:
    # tiny models: one thread keeps the shared CPU free and timings stable
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def write_spec(tmp_path: Path, **fields) -> Path:
    """A trial job file for the child."""
    spec = TrialSpec(out_dir=str(tmp_path / "trial"), **fields).validate()
    path = tmp_path / "job.json"
    path.write_text(JobSpec("trial", spec).validate().to_json())
    return path


def run_trial(spec_path: Path) -> subprocess.CompletedProcess:
    """Run the child to completion; subprocess.run kills it if it exceeds TIMEOUT_S."""
    return subprocess.run([sys.executable, "-m", "nsadiag.harness.child", str(spec_path)], cwd=REPO,
                          env=child_env(), capture_output=True, text=True, timeout=TIMEOUT_S)


def read_all_events(trial_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (trial_dir / "events.jsonl").read_text().splitlines()]


def read_events(trial_dir: Path) -> list[dict]:
    """The heartbeat events without the sampler's pulses (their number depends on timing)."""
    return [event for event in read_all_events(trial_dir) if event["kind"] != "pulse"]


def read_result(trial_dir: Path) -> dict:
    return json.loads((trial_dir / "result.json").read_text())


def module_events(events: list[dict], step: int) -> list[tuple[str, str, str]]:
    return [(e["module"], e["phase"], e["edge"]) for e in events
            if e["kind"] == "module" and e["step"] == step]


def span(events: list[tuple[str, str, str]], name: str, phase: str) -> tuple[int, int]:
    """Positions of the enter and exit events of `name` in `phase`."""
    return events.index((name, phase, "enter")), events.index((name, phase, "exit"))


# ----------------------------------------------------------------------------- tiny NSA


@pytest.fixture(scope="module")
def tiny_nsa_trial(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    tmp_path = tmp_path_factory.mktemp("tiny_nsa")
    spec = write_spec(tmp_path, target="nsa", overrides=TINY_NSA, n_layers=2, seq_len=64,
                      batch=1, steps=2)
    return run_trial(spec), tmp_path / "trial"


def test_tiny_nsa_trial_succeeds(tiny_nsa_trial):
    proc, trial_dir = tiny_nsa_trial
    assert proc.returncode == 0, proc.stderr
    result = read_result(trial_dir)
    assert result["status"] == "ok"
    assert result["steps_done"] == 2
    # the budget (600 s) allows two timing steps more: a median over steps 1-3
    assert result["timing_steps"] == 2
    assert result["exception"] is None and result["oom"] is False
    assert len(result["step_s"]) == len(result["forward_s"]) == len(result["backward_s"]) == 4
    assert all(s >= f + b for s, f, b in zip(result["step_s"], result["forward_s"],
                                             result["backward_s"], strict=True))
    assert result["peak_rss"] > 50 * 2**20  # torch alone maps more than this
    assert result["peak_cuda"] is None
    assert not (trial_dir / "result.json.tmp").exists()


def test_tiny_nsa_events_are_well_formed(tiny_nsa_trial):
    _, trial_dir = tiny_nsa_trial
    everything = read_all_events(trial_dir)
    assert [e["seq"] for e in everything] == list(range(len(everything)))
    events = read_events(trial_dir)
    assert (events[0]["kind"], events[0]["phase"]) == ("start", "build")
    assert (events[-1]["kind"], events[-1]["status"]) == ("end", "ok")
    assert all(e["rss"] > 0 and e["cuda_alloc"] is None and e["cuda_reserved"] is None
               for e in events)
    starts = [(e["phase"], e["step"]) for e in events if e["kind"] == "start"]
    assert starts == [("build", 0)] + [(p, s) for s in (0, 1, 2, 3)
                                       for p in ("forward", "backward", "optimizer")]
    steps = [e for e in events if e["kind"] == "step"]
    result = read_result(trial_dir)
    assert [e["step"] for e in steps] == [0, 1, 2, 3]
    assert [bool(e.get("timing")) for e in steps] == [False, False, True, True]
    assert [e["step_s"] for e in steps] == result["step_s"]
    assert [e["forward_s"] for e in steps] == result["forward_s"]


@pytest.mark.parametrize("step", [0, 1])
def test_tiny_nsa_block_order(tiny_nsa_trial, step):
    _, trial_dir = tiny_nsa_trial
    events = module_events(read_events(trial_dir), step)
    blocks = [e for e in events if e[0] in ("blocks.0", "blocks.1")]
    assert blocks == [
        ("blocks.0", "forward", "enter"), ("blocks.0", "forward", "exit"),
        ("blocks.1", "forward", "enter"), ("blocks.1", "forward", "exit"),
        ("blocks.1", "backward", "enter"), ("blocks.1", "backward", "exit"),
        ("blocks.0", "backward", "enter"), ("blocks.0", "backward", "exit")]


@pytest.mark.parametrize("step", [0, 1])
def test_tiny_nsa_branch_events_nest_in_their_block(tiny_nsa_trial, step):
    _, trial_dir = tiny_nsa_trial
    events = module_events(read_events(trial_dir), step)
    for i in range(2):
        block = f"blocks.{i}"
        for phase in ("forward", "backward"):
            start, stop = span(events, block, phase)
            for branch in BRANCHES:
                enter, leave = span(events, f"{block}.attn.{branch}", phase)
                assert start < enter < leave < stop, (block, branch, phase)
        enter, leave = span(events, f"{block}.attn.select", "forward")
        assert span(events, f"{block}.attn.cmp", "forward")[1] < enter < leave
        assert leave < span(events, f"{block}.attn.sel", "forward")[0]


def test_tiny_nsa_expected_events_per_step(tiny_nsa_trial):
    _, trial_dir = tiny_nsa_trial
    events = read_events(trial_dir)
    counted = [len(module_events(events, step)) for step in (0, 1)]
    # per block: block fwd+bwd (4) + cmp/sel/win fwd+bwd (3 x 4) + select fwd (2) = 18
    assert counted == [36, 36]
    assert read_result(trial_dir)["expected_events_per_step"] == 36


# ----------------------------------------------------------------------------- failures


def test_exception_in_backward_is_recorded(tmp_path):
    spec = write_spec(tmp_path, target="tests.diag_targets:fails_in_backward", n_layers=2,
                      seq_len=8, steps=2)
    proc = run_trial(spec)
    assert proc.returncode == 1, proc.stderr
    result = read_result(tmp_path / "trial")
    assert result["status"] == "error"
    assert result["steps_done"] == 0
    assert result["expected_events_per_step"] is None
    assert result["exception"]["type"] == "RuntimeError"
    assert result["exception"]["message"] == "injected failure in backward of block 1"
    assert result["exception"]["traceback"].endswith(
        "in backward\n    raise RuntimeError(\"injected failure in backward of block 1\")\n"
        "RuntimeError: injected failure in backward of block 1\n")
    assert result["oom"] is False
    events = read_events(tmp_path / "trial")
    modules = module_events(events, 0)
    # layers.1's backward started (its output gradient arrived) and never finished
    assert modules[-1] == ("layers.1", "backward", "enter")
    assert (events[-1]["kind"], events[-1]["phase"], events[-1]["status"]) == (
        "end", "backward", "error")


def test_bad_spec_exits_2_with_one_line(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"kind": "trial", "spec": {"target": "nsa", "seq_len": 0}}))
    proc = run_trial(path)
    assert proc.returncode == 2
    assert proc.stderr == "nsadiag.harness.child: seq_len: must be a positive integer, got 0\n"


def test_memory_cap_too_small_for_the_model(tmp_path):
    # 1M x 1024 fp32 embedding = 4 GiB: far above a 3 GiB address-space cap
    overrides = {**TINY_NSA, "vocab_size": 1 << 20, "dim": 1024}
    spec = write_spec(tmp_path, target="nsa", overrides=overrides, n_layers=1, seq_len=16,
                      steps=1, memory_cap_bytes=3 << 30)
    proc = run_trial(spec)
    assert proc.returncode == 1, proc.stderr
    result = read_result(tmp_path / "trial")
    assert result["status"] == "error" and result["oom"] is True
    assert result["exception"]["type"] == "RuntimeError"
    assert "can't allocate memory" in result["exception"]["message"]
    assert "4294967296 bytes" in result["exception"]["message"]
    events = read_events(tmp_path / "trial")
    assert [(e["kind"], e["phase"]) for e in events] == [("start", "build"), ("end", "build")]


def test_memory_cap_python_allocation_raises_memory_error(tmp_path):
    # a 4 GiB bytearray inside forward, under a 3 GiB address-space cap
    spec = write_spec(tmp_path, target="tests.diag_targets:allocates_in_forward",
                      overrides={"nbytes": 4 << 30}, seq_len=8, steps=1,
                      memory_cap_bytes=3 << 30)
    proc = run_trial(spec)
    assert proc.returncode == 1, proc.stderr
    result = read_result(tmp_path / "trial")
    assert result["status"] == "error" and result["oom"] is True
    assert (result["exception"]["type"], result["exception"]["message"]) == ("MemoryError", "")
    events = read_events(tmp_path / "trial")
    assert module_events(events, 0) == [("layers.0", "forward", "enter")]
    assert (events[-1]["kind"], events[-1]["phase"]) == ("end", "forward")


# ----------------------------------------------------------------------------- stacks


def test_sigusr1_dumps_all_threads(tmp_path):
    """One SIGUSR1 as soon as the child armed faulthandler (it is still importing torch),
    one while the block sleeps in forward: both dump, neither stops the child."""
    spec = write_spec(tmp_path, target="tests.diag_targets:sleepy",
                      overrides={"sleep_s": 60.0}, seq_len=8, steps=1)
    trial_dir = tmp_path / "trial"
    dump, events = trial_dir / "faulthandler.txt", trial_dir / "events.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.harness.child", str(spec)], cwd=REPO,
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: catches_sigusr1(proc.pid), TIMEOUT_S, "the child to arm faulthandler")
        os.kill(proc.pid, signal.SIGUSR1)
        wait_for(lambda: "Current thread 0x" in dump.read_text(), 30, "the early dump")
        early = dump.read_text()
        wait_for(lambda: events.exists() and '"edge":"enter"' in events.read_text(),
                 TIMEOUT_S, "the child to enter the sleeping forward")
        os.kill(proc.pid, signal.SIGUSR1)
        # threads are dumped newest first: the main thread's outermost frame ends the dump
        wait_for(lambda: "in _run_module_as_main" in
                 dump.read_text()[len(early):].partition("in forward")[2], 30,
                 "the whole dump in forward")
        text = dump.read_text()[len(early):]
        assert proc.poll() is None  # neither dump stopped the child
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert "diag_targets" not in early  # it was dumped before the target was imported
    assert "Current thread 0x" in text
    assert "Thread 0x" in text.replace("Current thread 0x", "")
    assert 'diag_targets.py", line' in text and "in forward" in text
    assert "in _idle_worker" in text
