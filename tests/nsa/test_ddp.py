"""Two-rank gloo DDP on CPU under torchrun: gradients and an end-to-end nsa.train run.

Each torchrun runs in its own session with a timeout; the whole process group is killed on
timeout, and the tests assert that no process of it survives.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nsa.train import TrainArgs, train
from tests.helpers import REPO, TESTS, checkout_env, read_jsonl
from tests.procs import wait_for

WORKER = TESTS / "ddp_grad_worker.py"
TIMEOUT_S = 120
WORLD = 2

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("restore_threads")]


def load_worker():
    spec = importlib.util.spec_from_file_location("ddp_grad_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run `torchrun --standalone --nproc_per_node WORLD ARGS`; kill its group on timeout.

    Fails the test when the run times out or when any process of its group outlives it.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(WORLD), *args]
    env = checkout_env(OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun exceeded {TIMEOUT_S} s:\n{out[-4000:]}")
    finally:
        assert_group_gone(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def assert_group_gone(pgid: int, wait_s: float = 10.0) -> None:
    """No process of session/group `pgid` may survive (kill stragglers, then fail)."""
    def gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_for(gone, wait_s, f"process group {pgid} to end")
    except AssertionError:
        os.killpg(pgid, signal.SIGKILL)
        pytest.fail(f"processes of group {pgid} survived torchrun")


def test_ddp_gradients_equal_single_process_on_concatenated_batch(tmp_path):
    out = tmp_path / "grads.pt"
    result = torchrun([str(WORKER), str(out)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:]
    saved = torch.load(out, weights_only=True)
    assert saved["world_size"] == WORLD
    reference = load_worker().reference_grads(WORLD)
    assert saved["grads"].keys() == reference.keys()
    worst = max((saved["grads"][k] - reference[k]).abs().max().item() for k in reference)
    assert worst <= 1e-6
    # The check is meaningful only if the shards differ and the gradients are not tiny.
    assert max(g.abs().max().item() for g in reference.values()) > 1e-3


def test_nsa_train_under_torchrun_writes_heartbeats_and_matches_one_process(tmp_path):
    common = dict(layers=2, dim=32, heads=2, kv_heads=1, head_dim=16, seq_len=32, steps=3,
                  lr=1e-2, warmup=1, min_lr=1e-3, data="text", seed=7,
                  overrides={"l": 8, "d": 4, "l_sel": 16, "n_sel": 3, "w": 16})
    flags = [f"--set={k}={v}" for k, v in common["overrides"].items()]
    for key, value in common.items():
        if key != "overrides":
            flags += [f"--{key.replace('_', '-')}", str(value)]
    out = tmp_path / "run"
    result = torchrun(["-m", "nsa.train", *flags, "--batch", "2", "--device", "cpu",
                       "--out", str(out), "--log-every", "1"], cwd=REPO)
    assert result.returncode == 0, result.stdout[-4000:]
    records = {r: read_jsonl(out / f"heartbeat-rank{r}.jsonl") for r in range(WORLD)}
    for rank, lines in records.items():
        steps = [line for line in lines if line["event"] == "step"]
        assert [s["step"] for s in steps] == [1, 2, 3]
        assert {s["rank"] for s in lines} == {rank}
        assert all(s["world_size"] == WORLD and s["rss_bytes"] > 0 for s in steps)
        assert lines[0]["event"] == "start" and lines[-1]["event"] == "end"
        assert lines[-1]["status"] == "ok"
    assert (out / "checkpoint.pt").is_file()
    # The logged loss is the mean over ranks: it equals one process on the whole batch.
    single = train(TrainArgs(**common, batch=2 * WORLD, device="cpu", log_every=0,
                           threads=1))
    ddp_losses = [s["loss"] for s in records[0] if s["event"] == "step"]
    assert max(abs(a - b) for a, b in zip(ddp_losses, single["losses"], strict=True)) <= 1e-5
