"""nsadiag check: each check passes on the built-in NSA target and names the module of a
planted defect; the CLI's exit codes; a check whose child fails reports the runner's verdict.

The checks' library functions run in this process (fast); run_check and the CLI run them in
a watched child, as users do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time

import psutil
import pytest
import torch

from nsadiag.checks import causality, ckpt, parity, run_check, run_checks
from nsadiag.harness.heartbeat import HeartbeatWriter
from nsadiag.harness.times import pg_timeout_for
from nsadiag.recordspec import RecordSpec
from nsadiag.spec import TrialSpec
from tests.helpers import nsadiag

TINY_NSA = dict(dim=32, n_heads=4, n_kv_heads=2, head_dim=8, l=8, d=4, l_sel=16, n_sel=3, w=16)
TINY_FLAGS = [f"--set={k}={v}" for k, v in TINY_NSA.items()]


def nsa_spec(**changes) -> TrialSpec:
    settings = {"n_layers": 2, "seq_len": 64, "batch": 2, "stall_timeout_s": 30.0, **changes}
    return TrialSpec(target="nsa", overrides=TINY_NSA, **settings).validate()


def factory_spec(target: str, **changes) -> TrialSpec:
    settings = {"seq_len": 16, "batch": 2, "stall_timeout_s": 30.0, **changes}
    return TrialSpec(target=target, **settings).validate()


@pytest.fixture
def writer(tmp_path):
    beat = HeartbeatWriter(tmp_path / "events.jsonl")
    yield beat
    beat.close()


# ---------------------------------------------------------------- causality

def test_causality_passes_on_nsa_and_the_perturbation_reaches_the_future(writer):
    result = causality.measure(nsa_spec(), writer)
    assert result.passed and result.verdict.name == "OK", result.summary
    assert result.verdict.facts.check.figures["reached_future"]  # not vacuous: rows >= t did change
    names = {row["module"] for row in result.table}
    assert {"blocks.0", "blocks.1", "blocks.1.attn.select", "blocks.1.attn.win"} <= names
    assert all(row["max abs diff before t"] <= row["tol"] for row in result.table)


def test_causality_names_the_block_that_reads_the_next_token(writer):
    result = causality.measure(factory_spec("tests.check_targets:future_peek"), writer)
    assert result.verdict.name == "WRONG"
    assert result.module == "layers.1"  # layers.0 is causal; the leak starts at layers.1
    rows = {row["module"]: row for row in result.table}
    assert not rows["layers.0"]["changed"] and rows["layers.1"]["changed"]
    assert "layers.1" in result.summary and "before position 8" in result.summary


def test_causality_second_pass_catches_a_leak_past_a_window_the_first_length_misses(writer):
    # the chunked window (512) leaks only past one chunk: S=128 shows nothing
    spec = factory_spec("tests.check_targets:window_leak", seq_len=128)
    first = causality.one_pass(causality.resolve(spec), 128, 2, 0, writer, 0)
    assert first.passed
    result = causality.measure(spec, writer, deadline=time.time() + 600)
    assert result.verdict.name == "WRONG" and result.module == "layers.1"
    assert result.verdict.facts.check.figures["long_seq_len"] == 4096
    assert result.summary.startswith("at S=4096, the second pass (S=128 showed nothing): "
                                     "perturbing tokens >= 2048 of 4096 changed layers.1's")
    rows = [(r["S"], r["module"], r["changed"]) for r in result.table]
    assert (128, "layers.1", False) in rows and (4096, "layers.1", True) in rows
    assert (4096, "layers.0", False) in rows  # the first block is causal at any length


def test_causality_second_pass_is_planned_from_the_first_and_what_is_left():
    plan = causality.plan_long_pass
    gib = 2**30
    # S=2048 took 2 s for batch 2: S=8192 at batch 1 predicts 2 x 16 / 2 x 1.5 = 24 s
    assert plan(2048, 2, 1.0, 2.0, 0, left_s=100.0, available_bytes=8 * gib) == (8192, None)
    # 30 s left: 8192 does not fit (25 s + 10 s reserve), 4096 does (1 + 6 s)
    assert plan(2048, 2, 1.0, 2.0, 0, left_s=30.0, available_bytes=8 * gib) == (4096, None)
    length, why = plan(2048, 2, 1.0, 2.0, 0, left_s=12.0, available_bytes=8 * gib)
    assert length is None and "S=8192 would take about 25 s, 12 s of the budget are left" in why
    # a short S still reaches past common windows: 4 x 128 is raised to 4096
    assert plan(128, 1, 0.1, 0.001, 0, left_s=600.0, available_bytes=8 * gib) == (4096, None)
    # memory: the first pass grew the peak 100 MiB; S=8192 needs x16 / 2 = 800 MiB, more
    # than half of 1 GiB; S=4096 needs 200 MiB
    assert plan(2048, 2, 0.0, 0.1, 100 * 2**20, left_s=600.0, available_bytes=gib) == \
        (4096, None)
    length, why = plan(2048, 2, 0.0, 0.1, 100 * 2**20, left_s=600.0,
                       available_bytes=300 * 2**20)
    assert length is None and "S=8192 would need about 0.8 GiB more" in why
    assert "S=4096 would need about 0.2 GiB more, 0.3 GiB are available" in why


def test_cli_check_causality_at_its_default_length_catches_the_window_leak(tmp_path):
    done = nsadiag("check", "causality", "--target", "tests.check_targets:window_leak",
                   "--out", str(tmp_path / "run"), "--json")
    assert done.returncode == 1, done.stderr
    (found,) = json.loads(done.stdout)["checks"]  # --json prints summary.json
    assert found["verdict"]["name"] == "WRONG" and found["module"] == "layers.1"
    assert "of 2048 changed layers.1's output" in found["summary"]  # the default S


# ---------------------------------------------------------------- parity

def test_parity_passes_on_nsa_with_errors_far_below_tolerance(writer):
    result = parity.measure(nsa_spec(), writer)
    assert result.passed and result.verdict.name == "OK", result.summary
    compared = [r for r in result.table if r["backend"] == "torch"]
    assert {r["module"] for r in compared} == {"blocks.0.attn", "blocks.1.attn"}
    assert {r["tensor"].split(" (")[0].split(" ")[0] for r in compared} == {"output", "grad"}
    assert max(r["max abs err"] for r in compared) < 1e-6  # 1e-5 tolerance, with margin


def test_parity_names_the_layer_of_a_broken_backend(writer):
    result = parity.measure(factory_spec("tests.check_targets:broken_backend", seq_len=64),
                            writer)
    assert result.verdict.name == "WRONG"
    assert result.module == "blocks.0.attn"
    assert result.verdict.facts.check.figures["backend"] == "torch"
    output = next(r for r in result.table if r["tensor"] == "output")
    # the mix is scaled by 1.01: the error is 1% of the output's magnitude
    assert output["max abs err"] == pytest.approx(0.01 * output["scale"], rel=0.05)


def test_parity_lists_a_backend_that_refuses_as_not_available(writer):
    # the tiny config's head_dim 8 is below the triton kernels' limit, on every machine
    result = parity.measure(nsa_spec(n_layers=1), writer)
    assert result.passed, result.summary
    refused = [r for r in result.table if r["backend"] == "triton"]
    assert [r["tensor"] for r in refused] == [
        "not available: head_dim 8 is not supported by the triton backend "
        "(one of 16, 32, 64, 128)"]
    assert "not available: triton" in result.summary


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or (
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="the triton kernels need triton and CUDA or the interpreter")
def test_parity_compares_the_triton_backend_with_the_oracle(writer):
    # compiled kernels take CUDA tensors; the interpreter's take CPU tensors
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = TrialSpec(target="nsa", overrides={**TINY_NSA, "head_dim": 16}, n_layers=1,
                     seq_len=40, batch=1, stall_timeout_s=30.0, device=device).validate()
    result = parity.measure(spec, writer)
    assert result.passed, result.summary
    rows = [r for r in result.table if r["backend"] == "triton"]
    assert rows and all(r["ok"] for r in rows), rows


def test_parity_without_nsa_layers_is_not_applicable(writer):
    result = parity.measure(factory_spec("tests.check_targets:future_peek"), writer)
    assert result.passed and result.summary.startswith("not applicable: parity needs")
    assert result.verdict.facts.check.applicable is False and result.table == []
    # shown as its own status, never as OK: nothing was checked
    assert not result.applicable and result.status == "NOT APPLICABLE"
    assert result.to_dict()["status"] == "NOT APPLICABLE"
    from nsadiag.finding.check import check_finding

    found = check_finding([result], RecordSpec(target="tests.check_targets:future_peek"))
    assert found.status == "healthy" and found.results[0].mark == "warn"
    assert found.headline == "OK (healthy): 0 check(s) passed, 1 not applicable"


# ---------------------------------------------------------------- ckpt

def test_ckpt_passes_on_nsa_with_every_recompute_matched(writer):
    result = ckpt.measure(nsa_spec(), writer)
    assert result.passed and result.verdict.name == "OK", result.summary
    assert result.verdict.facts.check.figures["recomputed_calls"] > 0
    assert all(r["ok"] and r["max abs err"] <= r["tol"] for r in result.table)
    assert {r["module"] for r in result.table} >= {"blocks.0", "blocks.1"}


@pytest.mark.parametrize("reentrant", [False, True])
def test_ckpt_names_the_block_of_the_late_bound_closure(writer, reentrant):
    spec = factory_spec("repro.late_bound_ckpt:make", overrides={"reentrant": reentrant})
    result = ckpt.measure(spec, writer)
    assert result.verdict.name == "WRONG"
    assert result.module == "blocks.0"
    assert result.summary.startswith("recompute of blocks.0 ran blocks.3's parameters")
    grads = {r["module"]: r for r in result.table if r["part"] == "gradients"}
    assert not grads["blocks.0"]["ok"] and grads["head.weight"]["ok"]
    if reentrant:  # the reentrant recompute sends blocks 0-2's gradients to blocks.3
        assert "no gradient with checkpointing" in grads["blocks.0"]["detail"]


def test_ckpt_names_a_module_whose_recompute_is_not_exact(writer):
    result = ckpt.measure(factory_spec("tests.check_targets:drifting_recompute"), writer)
    assert result.verdict.name == "WRONG"
    assert result.module == "layers.1"
    assert result.summary.startswith("recompute of layers.1 diverged from its forward: "
                                     "inside it, layers.1.mix received an input")
    grads = {r["module"]: r for r in result.table if r["part"] == "gradients"}
    assert not grads["layers.1"]["ok"] and grads["layers.2"]["ok"]


def test_ckpt_matches_recomputes_by_module_when_several_linears_share_an_input(writer):
    # W_Q, W_K and W_V take the same x; only W_K's input changes in the recompute (to the
    # tensor W_Q and W_V received): W_K is named, W_Q never "ran W_K's parameters"
    result = ckpt.measure(factory_spec("tests.check_targets:shared_input_recompute"),
                          writer)
    assert result.verdict.name == "WRONG" and result.module == "layers.0"
    assert result.summary.startswith("recompute of layers.0 diverged from its forward: inside "
                                     "it, layers.0.W_K received an input its own forward did "
                                     "not receive")
    recompute = [r["detail"] for r in result.table if r["part"] == "recompute"]
    assert not any("parameters" in detail for detail in recompute), recompute
    assert all("W_Q" not in detail and "W_V" not in detail for detail in recompute)


def test_ckpt_passes_on_a_healthy_checkpointed_factory(writer):
    result = ckpt.measure(factory_spec("tests.check_targets:checkpointed_tiny"), writer)
    figures = result.verdict.facts.check.figures
    assert result.passed and figures["recomputed_calls"] > 0, result.summary


def test_ckpt_passes_on_a_model_with_dropout(writer):
    result = ckpt.measure(factory_spec("tests.check_targets:dropout_tiny"), writer)
    assert result.passed, result.summary


def test_parity_names_a_nan_gradient_even_when_it_is_not_the_first_parameter():
    ok = torch.ones(3)
    reference = {"output": ok, "grad input": ok, "grads": {"a": ok, "b": ok, "c": ok}}
    got = {"output": ok, "grad input": ok,
           "grads": {"a": ok, "b": torch.tensor([float("nan"), 1.0, 1.0]), "c": ok}}
    rows = parity.compare("blocks.0.attn", "torch", got, reference)
    assert rows[-1]["tensor"].startswith("grad b") and rows[-1]["ok"] is False


def test_ckpt_on_a_target_that_cannot_checkpoint_is_not_applicable(writer):
    result = ckpt.measure(factory_spec("tests.check_targets:future_peek"), writer)
    assert result.passed and "does not accept 'grad_ckpt'" in result.summary


# ---------------------------------------------------------------- in a child, ddp

def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_ddp_check_matches_one_process_on_nsa_and_leaves_no_process(tmp_path):
    before = _children()
    result = run_check("ddp", nsa_spec(), tmp_path)
    assert _children() <= before
    assert result.passed and result.verdict.name == "OK", result.summary
    assert result.verdict.facts.ranks.world_size == 2
    assert max(r["max abs err"] for r in result.table) < 1e-6


def test_ddp_check_with_reentrant_late_bound_closure_is_an_error_naming_the_cause(tmp_path):
    spec = factory_spec("repro.late_bound_ckpt:make", grad_ckpt=True,
                        overrides={"reentrant": True})
    before = _children()
    result = run_check("ddp", spec, tmp_path)
    assert _children() <= before
    assert not result.passed and result.verdict.name == "ERROR"
    assert "Expected to mark a variable ready only once" in result.summary


def test_ddp_process_group_timeout_outlasts_the_stall_watch():
    # the watcher must see a stuck collective (and sample its stacks) before gloo's own
    # timeout turns it into an exception on every rank
    for stall in (3.0, 60.0, 600.0):
        assert pg_timeout_for(stall) > 2 * stall


def test_a_check_whose_target_fails_reports_the_runner_verdict(tmp_path):
    (result,) = run_checks(["causality"], factory_spec("tests.diag_targets:sleepy",
                                                       stall_timeout_s=3.0,
                                                       overrides={"sleep_s": 60.0}), tmp_path)
    assert not result.passed
    assert result.verdict.name == "DEADLOCK", result.summary
    assert result.summary.startswith("the causality check did not finish: DEADLOCK")


def test_an_unknown_check_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="check: must be one of causality, parity, ckpt, ddp"):
        run_checks(["causality", "speed"], nsa_spec(), tmp_path)
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------- CLI

def test_cli_check_ckpt_on_the_late_bound_closure_exits_1_with_a_report(tmp_path):
    out = tmp_path / "run"
    done = nsadiag("check", "ckpt", "--target", "repro.late_bound_ckpt:make", "--seq-len",
                   "16", "--out", str(out), "--json")
    assert done.returncode == 1, done.stderr
    (found,) = json.loads(done.stdout)["checks"]
    assert found["verdict"]["name"] == "WRONG" and found["module"] == "blocks.0"
    summary = json.loads((out / "summary.json").read_text())
    finding = summary["finding"]
    assert (finding["verdict"], finding["kind"]) == ("WRONG", "wrong") and not summary["passed"]
    assert finding["culprit"]["module"] == "blocks.0" and "blocks.3" in finding["proof"]
    # decided by the command and kept with the checks (raw: its rerun names the run
    # directory as it is); the report lays it out, redacted
    kept = json.loads((out / "checks.json").read_text())["finding"]
    assert {**kept, "next_action": None} == {**finding, "next_action": None}
    assert kept["next_action"].endswith(f"--out {out} --json`.")
    report = (out / "report.md").read_text()
    assert report.startswith("# nsadiag check: ❌ WRONG (wrong): the ckpt check in blocks.0")
    for section in ("## Summary", "## Configuration", "## Results", "## Evidence",
                    "## Root cause", "## Minimal reproduction", "## Recommendations"):
        assert section in report
    assert "recompute of blocks.0 ran blocks.3's parameters" in report
    # no --layers: the report states the blocks the factory's model actually had
    assert "| n_layers | 4 (the factory's default) |" in report


def test_cli_check_passes_with_exit_0(tmp_path):
    done = nsadiag("check", "causality", *TINY_FLAGS, "--layers", "1", "--seq-len", "32",
                   "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "causality" in done.stdout and "OK" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["check", "speed"], "check: 'speed' is not one of 'causality', 'parity', 'ckpt', 'ddp', "
                         "'all'"),
    (["check", "ddp", "--world-size", "1"], "world-size: the ddp check needs at least 2"),
    (["check", "ckpt", "--set", "n_heads=3"], "n_heads: must be a multiple of n_kv_heads"),
    (["check", "ckpt", "--target", "no.such.module:make"], "target: cannot import"),
])
def test_cli_usage_errors_exit_2_with_one_line(tmp_path, args, message):
    done = nsadiag(*args, "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
