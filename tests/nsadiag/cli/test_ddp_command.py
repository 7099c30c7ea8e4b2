"""nsadiag ddp end to end: a healthy 2-rank run of the built-in target, the late-bound
checkpoint closure under DDP with reentrant checkpointing, and bad options."""

import json

import pytest
import torch
from typer.testing import CliRunner

from nsadiag.cli import app
from nsadiag.harness.jobs import run_ddp_trial
from nsadiag.ranknames import rank_names
from nsadiag.spec import TrialSpec
from repro import DDP_ZOO
from tests.helpers import nsadiag

TINY = dict(dim=32, n_heads=4, n_kv_heads=2, head_dim=8, l=8, d=4, l_sel=16, n_sel=3, w=16)


def test_healthy_nsa_is_ok_with_equal_collective_counts(tmp_path):
    spec = TrialSpec(target="nsa", n_layers=2, overrides=TINY, seq_len=64, batch=2, steps=2,
                     stall_timeout_s=20.0, budget_s=120.0, out_dir=str(tmp_path / "trial"))
    record = run_ddp_trial(spec, 2, "gloo")
    assert record.verdict_name == "OK", record.verdict
    counts = record.verdict.facts.ranks.collectives_issued
    # per step: one DDP bucket all_reduce (the tiny model fits one bucket) + the loss mean
    assert counts == {0: 4, 1: 4}
    ranks = record.evidence.ranks
    for rank in ranks:
        assert rank["collectives"]["open"] == [] and rank["collectives"]["completed"] == 4
        assert [c["origin"] for c in rank["started"]] == ["ddp", "call", "ddp", "call"]
    # the loss each rank reports is the mean over ranks, so both hold the same numbers
    assert ranks[0]["result"]["loss"] == ranks[1]["result"]["loss"]
    # each rank named by this host and torchrun's local and node rank (one node: node 0)
    host = rank_names({}).host
    assert [(r.host, r.rank, r.local_rank, r.node_rank)
            for r in record.verdict.facts.ranks.ranks] == [(host, 0, 0, 0), (host, 1, 1, 0)]


def test_one_rank_runs_under_torchrun_and_counts_its_collectives(tmp_path):
    # one rank is still a DDP trial: one GPU holds only one NCCL rank, so the GPU test of
    # the nccl path below needs this path too
    out = tmp_path / "run"
    done = nsadiag("ddp", "--world-size", "1", "--preset", "tiny", "--layers", "2",
                   "--seq-len", "64", "--steps", "2", "--stall-timeout", "20", "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["verdict"], summary["world_size"], summary["ddp_backend"]) == \
        ("OK", 1, "gloo")
    # per step: the DDP bucket all_reduce and the loss mean, as with two ranks
    assert [(row["rank"], row["issued"]) for row in summary["ranks"]] == [(0, 4)]
    assert (out / "trial-0" / "rank-0" / "result.json").is_file()
    assert summary["flight_recorder"] == []  # gloo: no NCCL Flight Recorder
    # decided once as the job ended and kept beside its record; the report lays it out
    kept = json.loads((out / "finding.json").read_text())["finding"]
    assert kept["headline"] == summary["headline"] and kept["command"] == "ddp"


def test_late_bound_checkpoint_under_ddp_is_an_error_explained(tmp_path):
    verdict, world, settings = DDP_ZOO["late_bound_ckpt"]
    out = tmp_path / "run"
    done = nsadiag("ddp", "--world-size", str(world), "--target", "repro.late_bound_ckpt:make",
                   "--set", "reentrant=true", "--grad-ckpt", "--seq-len",
                   str(settings["seq_len"]), "--batch", str(settings["batch"]),
                   "--stall-timeout", "20", "--out", str(out))
    assert done.returncode == 1, done.stderr  # a failure found
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == verdict
    failing = summary["failing"]
    assert "Expected to mark a variable ready only once" in failing["reasons"][0]
    assert failing["facts"]["cause"].startswith("a parameter received its gradient twice")
    assert "blocks.3" in failing["facts"]["cause"]  # the last block, recomputed per layer
    report = (out / "report.md").read_text()
    assert "marked as ready twice" in report
    assert "late-bound closure `lambda x: blk(x)`" in report
    assert "functools.partial(checkpoint, blk)" in report
    assert "| host | rank | local rank | node rank | pid | state |" in report


@pytest.mark.parametrize("args, message", [
    (["--world-size", "0"], "nsadiag: error: world-size: input should be greater than or "
                            "equal to 1 (see root ddp --help)"),
    (["--ddp-backend", "mpi"], "nsadiag: error: ddp-backend: 'mpi' is not one of 'gloo', "
                               "'nccl' (see root ddp --help)"),
    (["--pg-timeout", "-1"], "nsadiag: error: pg-timeout: must be a positive number of "
                             "seconds, got -1.0"),
    (["--pg-timeout", "nan"], "nsadiag: error: pg-timeout: must be a positive number of "
                              "seconds, got nan"),
])
def test_bad_options_are_one_line_exit_2(tmp_path, args, message):
    done = CliRunner().invoke(app, ["ddp", *args, "--out", str(tmp_path / "run")])
    assert done.exit_code == 2
    assert done.stderr.strip() == message
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_nccl_without_cuda_is_one_line_exit_2(tmp_path):
    done = CliRunner().invoke(app, ["ddp", "--ddp-backend", "nccl", "--out",
                                    str(tmp_path / "run")])
    assert done.exit_code == 2
    assert done.stderr.strip().startswith("nsadiag: error: ddp-backend: nccl needs CUDA")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nccl_single_rank_is_ok_and_arms_the_flight_recorder(tmp_path):
    spec = TrialSpec(target="nsa", n_layers=2, overrides=TINY, seq_len=64, batch=2, steps=2,
                     device="cuda", stall_timeout_s=30.0, budget_s=300.0,
                     out_dir=str(tmp_path / "trial"))
    record = run_ddp_trial(spec, 1, "nccl")
    assert record.verdict_name == "OK", record.verdict
    assert record.verdict.facts.ranks.collectives_issued == {0: 4}
    assert (tmp_path / "trial" / "flight-recorder").is_dir()
