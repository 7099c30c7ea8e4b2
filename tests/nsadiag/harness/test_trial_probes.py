"""Probes wired into trials: saved-for-backward bytes per NSA branch in results, rows and
reports; stall evidence with the stack classification, the unfinished backward and GPU
state; the faulthandler rung when py-spy is missing."""

from __future__ import annotations

import json

import psutil
import torch

from nsadiag.harness.child import run, seed_everything
from nsadiag.harness.heartbeat import unfinished_backward
from nsadiag.harness.jobs import run_trial
from nsadiag.probes import stacks
from nsadiag.probes.gpu import GpuUnavailable, gpu_json
from nsadiag.probes.memory import SavedTensorLedger
from nsadiag.report.markdown import results_table
from nsadiag.runmeta import RunMeta
from nsadiag.spec import JobSpec, TrialSpec
from nsadiag.sweep import SweepRow, row_from_record
from nsadiag.targets import resolve
from tests.helpers import sweep_report

TINY_NSA = {"dim": 32, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "l": 8, "d": 4,
            "l_sel": 16, "n_sel": 3, "w": 16, "query_chunk": 16, "compress_hidden": 16,
            "vocab_size": 64}


def test_trial_counts_saved_bytes_per_branch_like_the_memory_probe(tmp_path):
    spec = TrialSpec(target="nsa", overrides=TINY_NSA, n_layers=2, seq_len=64, steps=1,
                     out_dir=str(tmp_path)).validate()
    result = run(JobSpec("trial", spec), None, tmp_path)
    assert result["status"] == "ok", result["exception"]
    seed_everything(spec.seed)
    target = resolve(spec)
    ids = torch.randint(target.vocab_size, (spec.batch, spec.seq_len + 1))
    with SavedTensorLedger(target.model) as ledger:  # its own branch wrappers
        target.loss(ids)
    assert result["saved_by_branch"] == ledger.by_branch()
    assert all(result["saved_by_branch"][b] > 0 for b in ("cmp", "sel", "win"))
    assert result["saved_bytes"] == ledger.total


def _event(seq, kind, phase, module=None, edge=None):
    event = {"t": 100.0 + seq, "seq": seq, "kind": kind, "phase": phase, "step": 0}
    if module:
        event.update(module=module, edge=edge)
    return event


def test_unfinished_backward_is_the_open_modules_innermost_first():
    events = [_event(0, "start", "backward"),
              _event(1, "module", "backward", "blocks.1", "enter"),
              _event(2, "module", "backward", "blocks.1", "exit"),
              _event(3, "module", "backward", "blocks.0", "enter"),
              _event(4, "module", "forward", "blocks.0.attn.sel", "enter"),  # ckpt recompute
              _event(5, "module", "backward", "blocks.0.attn.sel", "enter")]
    assert unfinished_backward(events) == ["blocks.0.attn.sel", "blocks.0"]
    # a new backward phase (next step) starts from nothing
    assert unfinished_backward(events + [_event(6, "start", "backward")]) == []


def test_results_table_has_a_column_per_branch():
    row = SweepRow(label="", n_layers=2, verdict="OK", forward_s=0.1, backward_s=0.2,
                   step_s=0.4, peak_rss=400 * 2**20, saved_bytes=6 * 2**20, steps_done=2,
                   trial_dir="t", saved_by_branch={"cmp": 2**20, "sel": 3 * 2**20,
                                                   "win": 2**20})
    old = SweepRow(**{**row.to_dict(), "saved_by_branch": None})
    header, _, line, line_old = results_table([row, old])
    assert "| saved cmp | saved sel | saved win |" in header
    assert "| 6 MiB | 1 MiB | 3 MiB | 1 MiB | - | 2 |" in line
    assert "| 6 MiB | - | - | - | - | 2 |" in line_old  # a record written before branches
    small = SweepRow(**{**row.to_dict(), "saved_bytes": 12 * 2**10, "saved_by_branch": {}})
    assert "| 12 KiB | - | - | - | - | 2 |" in results_table([small])[2]  # no NSA branches
    alone = SweepRow(**{**row.to_dict(), "saved_by_branch": {"sel": 3 * 2**20}})
    assert "| 6 MiB | - | 3 MiB | - | - | 2 |" in results_table([alone])[2]  # sel only


def test_stall_evidence_names_the_class_and_the_open_backward_without_py_spy(
        tmp_path, monkeypatch):
    """py-spy missing: the runner's samples come from the child's faulthandler dumps."""
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
    spec = TrialSpec(target="tests.diag_targets:waits_in_backward", n_layers=2, seq_len=8,
                     steps=1, stall_timeout_s=3.0, budget_s=60.0,
                     out_dir=str(tmp_path / "trial-0")).validate()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    record = run_trial(spec)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert record.verdict_name == "DEADLOCK", record.verdict
    stall = record.evidence.stall
    assert stall.stacks_class == "waiting"
    assert stall.unfinished_backward == ["layers.1"]
    assert len(stall.samples) == 3 and stall.unavailable == []
    assert all(s.note.startswith("stacks from faulthandler: py-spy: not found")
               for s in stall.samples)
    functions = {f.function for t in stall.samples[-1].threads for f in t.frames}
    assert "backward" in functions
    assert "wait" in " ".join(record.verdict.reasons) or "blocked" in " ".join(
        record.verdict.reasons)

    text, summary = sweep_report(tmp_path, [record], RunMeta(command_name="sweep-layers"))
    assert "- Stacks read as **waiting** over 3 sample(s) (stacks from faulthandler" in text
    assert "- Backward started and never finished: `layers.1` (innermost first)" in text
    gpu = str(record.gpu) if isinstance(record.gpu, GpuUnavailable) else "GPU 0"
    assert gpu in text  # NVML state, or its one-line reason on a machine without a driver
    assert summary["stall"]["stacks_class"] == "waiting"
    assert summary["stall"]["unfinished_backward"] == ["layers.1"]
    assert summary["stall"]["gpu"] == json.loads(json.dumps(gpu_json(record.gpu)))
    row = row_from_record(record)  # killed: rebuilt from the backward start event
    assert row.saved_by_branch == {} and row.saved_bytes > 0  # no NSA branch here
