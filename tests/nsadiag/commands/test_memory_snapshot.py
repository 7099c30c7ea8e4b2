"""The headless memory-history summary on synthetic snapshot dicts (the format
torch.cuda.memory._snapshot() returns), the A/B comparison helpers, and the CPU degradation
of history, per-layer deltas and --ab-expandable-segments."""

import json

import pytest
import torch

from nsadiag.commands.memory import alloc_conf, compare_ab
from nsadiag.probes.snapshot import (
    allocation_site,
    live_at_peak,
    memory_history,
    summarize_snapshot,
)
from nsadiag.rundir import write_bytes
from tests.helpers import nsadiag

MiB = 2**20
PROJECT = "/work/proj/model.py"
TORCH = "/venv/lib/python3.11/site-packages/torch/nn/functional.py"


def frames(*where):
    """Innermost first, like the snapshot: (file, line, function) triples."""
    return [{"filename": f, "line": n, "name": fn} for f, n, fn in where]


ATTN = frames((TORCH, 10, "softmax"), (PROJECT, 42, "attention"))
MLP = frames((TORCH, 20, "linear"), (PROJECT, 77, "mlp"))
NATIVE = frames(("??", 0, "at::empty"))


def snapshot():
    """Before recording: one 2 MiB block (freed in the trace) and one 1 MiB block (still
    live, never in the trace). Then: attention 8 MiB + 4 MiB (15 MiB live), the 2 MiB block
    freed, mlp 6 MiB (the peak: 1 + 8 + 4 + 6 = 19 MiB), attention's 8 MiB freed, mlp
    1 MiB (12 MiB)."""
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 32 * MiB, "frames": []},
        {"action": "alloc", "addr": 100, "size": 8 * MiB, "frames": ATTN},
        {"action": "alloc", "addr": 200, "size": 4 * MiB, "frames": ATTN},
        {"action": "free_requested", "addr": 900, "size": 2 * MiB, "frames": NATIVE},
        {"action": "free_completed", "addr": 900, "size": 2 * MiB, "frames": NATIVE},
        {"action": "alloc", "addr": 300, "size": 6 * MiB, "frames": MLP},
        {"action": "free_requested", "addr": 100, "size": 8 * MiB, "frames": ATTN},
        {"action": "free_completed", "addr": 100, "size": 8 * MiB, "frames": ATTN},
        {"action": "alloc", "addr": 400, "size": 1 * MiB, "frames": MLP},
    ]
    segments = [
        {"address": 0, "total_size": 32 * MiB, "segment_type": "large", "blocks": [
            {"address": 100, "size": 8 * MiB, "state": "inactive", "frames": []},
            {"address": 200, "size": 4 * MiB, "state": "active_allocated", "frames": ATTN},
            {"address": 300, "size": 6 * MiB, "state": "active_allocated", "frames": MLP},
            {"address": 400, "size": 1 * MiB, "state": "active_allocated", "frames": MLP},
            {"address": 500, "size": 13 * MiB, "state": "inactive", "frames": []}]},
        {"address": 64 * MiB, "total_size": 2 * MiB, "segment_type": "small", "blocks": [
            {"address": 950, "size": 1 * MiB, "state": "active_allocated", "frames": NATIVE},
            {"address": 951, "size": 1 * MiB, "state": "inactive", "frames": []}]},
    ]
    return {"segments": segments, "device_traces": [trace]}


def test_peak_counts_blocks_from_before_the_trace_and_stops_at_the_free():
    peak, blocks = live_at_peak(snapshot())
    assert peak == 19 * MiB
    assert sorted(blocks) == [100, 200, 300, 950]  # 900 was freed before the peak


def test_top_sites_at_the_peak_use_the_innermost_project_frame():
    summary = summarize_snapshot(snapshot())
    assert summary["top_sites"] == [
        {"site": "attention (model.py:42)", "bytes": 12 * MiB, "blocks": 2},
        {"site": "mlp (model.py:77)", "bytes": 6 * MiB, "blocks": 1},
        {"site": "at::empty (??:0)", "bytes": 1 * MiB, "blocks": 1},
    ]
    assert summary["peak_live"] == 19 * MiB and summary["trace_entries"] == 9


def test_segment_picture_largest_free_block_and_fragmentation():
    summary = summarize_snapshot(snapshot())
    assert summary["segments"] == 2
    assert summary["reserved"] == 34 * MiB and summary["allocated"] == 12 * MiB
    assert summary["free_blocks"] == 3 and summary["largest_free_block"] == 13 * MiB
    assert summary["fragmentation"] == pytest.approx(22 / 34)
    assert [s["type"] for s in summary["largest_segments"]] == ["large", "small"]
    assert summary["largest_segments"][0]["largest_free"] == 13 * MiB


def test_allocation_site_falls_back_to_the_innermost_frame():
    assert allocation_site(frames((TORCH, 3, "empty"), ("/usr/lib/python3.11/x.py", 1, "f"))) \
        == "empty (functional.py:3)"
    assert allocation_site([]) == "<no Python frames: native code or the autograd engine>"
    assert allocation_site(None) == "<allocated before recording began>"


def test_empty_snapshot_summarises_to_zeros():
    summary = summarize_snapshot({"segments": [], "device_traces": []})
    assert (summary["peak_live"], summary["top_sites"], summary["reserved"],
            summary["fragmentation"], summary["largest_free_block"]) == (0, [], 0, 0.0, 0)


def test_memory_history_is_one_line_on_cpu(tmp_path):
    with memory_history(torch.device("cpu"), tmp_path, write_bytes) as history:
        torch.ones(4).sum()
    assert history == {"unavailable": "memory history: not available on this device (cpu)"}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_memory_history_on_cuda_writes_a_snapshot_and_names_the_site(tmp_path):
    def hold():
        return torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")

    with memory_history(torch.device("cuda"), tmp_path, write_bytes) as history:
        kept = hold()
    assert (tmp_path / "snapshot.pickle").stat().st_size > 0
    # blocks that earlier tests left alive count as allocated before recording began
    sites = {s["site"].split(" (")[0]: s for s in history["summary"]["top_sites"]}
    assert sites["hold"]["site"].startswith("hold (test_memory_snapshot.py:")
    assert sites["hold"]["bytes"] >= 64 * MiB
    assert set(sites) <= {"hold", "<allocated before recording began>"}
    del kept


def test_alloc_conf_sets_and_removes_expandable_segments():
    assert alloc_conf(None, True) == "expandable_segments:True"
    assert alloc_conf(None, False) is None
    assert alloc_conf("max_split_size_mb:128,expandable_segments:True", False) == \
        "max_split_size_mb:128"
    assert alloc_conf("expandable_segments:False, max_split_size_mb:64", True) == \
        "max_split_size_mb:64,expandable_segments:True"


def test_compare_ab_reports_ratios():
    base = {"cuda": {"reserved": 100, "allocated": 50, "fragmentation": 0.5,
                     "peak_allocated": 80, "peak_reserved": 120, "num_alloc_retries": 0,
                     "largest_free_block": 10}, "step_s": 2.0}
    new = {"cuda": {"reserved": 60, "allocated": 50, "fragmentation": 1 / 6,
                    "peak_allocated": 80, "peak_reserved": 70, "num_alloc_retries": 0,
                    "largest_free_block": 8}, "step_s": 2.2}
    rows = {r["quantity"]: r for r in compare_ab(base, new)}
    assert rows["reserved"]["change"] == pytest.approx(0.6)
    assert rows["step_s"]["change"] == pytest.approx(1.1)
    assert rows["num_alloc_retries"]["change"] is None  # 0 -> 0: no ratio
    assert set(rows) == {"reserved", "allocated", "fragmentation", "peak_allocated",
                         "peak_reserved", "num_alloc_retries", "largest_free_block", "step_s"}


def test_ab_expandable_segments_on_cpu_is_one_line_exit_2(tmp_path):
    done = nsadiag("memory", "--target", "tests.diag_targets:tiny_lm", "--seq-len", "8",
                   "--ab-expandable-segments", "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr == ("nsadiag: error: ab-expandable-segments: needs a CUDA device "
                           "(--device cuda); this run's device is cpu\n")
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_cpu_memory_report_says_history_is_unavailable(tmp_path):
    done = nsadiag("memory", "--target", "tests.diag_targets:tiny_lm", "--seq-len", "8",
                   "--steps", "1", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "memory history: not available on this device (cpu)" in done.stdout
    stored = json.loads((tmp_path / "run" / "memory.json").read_text())
    assert stored["history"] == {
        "unavailable": "memory history: not available on this device (cpu)"}
    assert not (tmp_path / "run" / "snapshot.pickle").exists()


def test_the_layer_that_saves_a_big_tensor_stands_out():
    from nsadiag.commands.memory import memory_command
    from nsadiag.spec import TrialSpec

    spec = TrialSpec(target="tests.diag_targets:hoards_in_layer", n_layers=4, seq_len=32,
                     steps=1).validate()
    summary = memory_command(spec)
    rows = {row["layer"]: row for row in summary["per_layer"]}
    assert list(rows) == ["layers.0", "layers.1", "layers.2", "layers.3"]
    assert summary["layer_standouts"] == ["layers.2"]
    others = [rows[name]["saved"] for name in ("layers.0", "layers.1", "layers.3")]
    # exp saves its [1, 32, 1024] fp32 output: 128 KiB on top of what a plain block saves
    assert rows["layers.2"]["saved"] - max(others) >= 32 * 64 * 16 * 4
    assert all(row["cuda_delta"] is None for row in rows.values())  # CPU: saved bytes only
    assert sum(r["saved"] for r in rows.values()) <= summary["saved_total"]


def test_a_memory_job_measures_in_a_watched_child(tmp_path):
    from nsadiag.harness.jobs import run_job
    from nsadiag.spec import JobSpec, TrialSpec

    spec = TrialSpec(target="tests.diag_targets:tiny_lm", seq_len=8, steps=2,
                     out_dir=str(tmp_path / "job")).validate()
    record = run_job(JobSpec("memory", spec, top=3).validate())
    assert record.verdict_name == "OK", record.verdict
    measured = record.evidence.result["memory"]
    assert len(measured["largest_saved"]) == 3 and measured["step_s"] > 0
    assert [row["layer"] for row in measured["per_layer"]] == ["layers.0", "layers.1"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_memory_command_records_history_and_layer_deltas(tmp_path):
    from nsadiag.commands.memory import memory_command
    from nsadiag.spec import TrialSpec

    spec = TrialSpec(target="tests.diag_targets:hoards_in_layer", n_layers=4, seq_len=64,
                     steps=2, device="cuda").validate()
    summary = memory_command(spec, tmp_path)
    assert (tmp_path / "snapshot.pickle").stat().st_size > 0
    rows = {row["layer"]: row for row in summary["per_layer"]}
    others = [rows[name]["cuda_delta"] for name in ("layers.0", "layers.1", "layers.3")]
    assert rows["layers.2"]["cuda_delta"] > max(others)
    history = summary["history"]["summary"]
    assert history["top_sites"] and history["reserved"] >= history["allocated"]
    assert summary["cuda"]["peak_reserved"] >= summary["cuda"]["peak_allocated"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ab_expandable_segments_measures_both_in_children(tmp_path):
    from nsadiag.commands.memory import ab_expandable_segments
    from nsadiag.spec import TrialSpec

    spec = TrialSpec(target="tests.diag_targets:tiny_lm", seq_len=64, steps=2,
                     device="cuda").validate()
    ab = ab_expandable_segments(spec, tmp_path)
    assert ab["baseline"]["device"] == ab["expandable"]["device"] == "cuda"
    rows = {row["quantity"]: row for row in ab["rows"]}
    assert rows["reserved"]["baseline"] > 0 and rows["reserved"]["expandable"] > 0
    assert rows["step_s"]["change"] is not None
