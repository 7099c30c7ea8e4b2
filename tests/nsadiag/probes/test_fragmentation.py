"""Fragmentation at an out-of-memory error (nsadiag.probes.fragmentation): the allocator's
segments summed, the request read from the message, and a clear line off CUDA, in the
record and the report of a stranger's run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from nsadiag.probes.fragmentation import at_oom, from_segments, requested_bytes
from tests.helpers import checkout_env, nsadiag

MiB = 2**20


def _segment(*blocks: tuple[int, str]) -> dict:
    return {"total_size": sum(size for size, _ in blocks),
            "blocks": [{"size": size, "state": state} for size, state in blocks]}


def test_requested_bytes_from_a_cuda_oom_message() -> None:
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
               "of 79.15 GiB of which 1.2 GiB is free.")
    assert requested_bytes(message) == 2 * 2**30
    assert requested_bytes("Tried to allocate 512.00 MiB") == 512 * MiB
    assert requested_bytes("out of memory") is None


def test_free_memory_in_pieces_is_fragmented_and_one_free_block_is_not() -> None:
    pieces = [_segment((60 * MiB, "active_allocated"), (20 * MiB, "inactive")),
              _segment((30 * MiB, "inactive"), (10 * MiB, "active_allocated")),
              _segment((25 * MiB, "inactive"), (5 * MiB, "active_pending_free"))]
    found = from_segments(pieces, 64 * MiB)
    assert found == {"reserved": 150 * MiB, "allocated": 70 * MiB,
                     "free_in_reserved": 75 * MiB, "largest_free_block": 30 * MiB,
                     "requested": 64 * MiB, "fragmented": True}
    whole = [_segment((60 * MiB, "active_allocated"), (70 * MiB, "inactive"))]
    assert not from_segments(whole, 64 * MiB)["fragmented"]  # it fits: not why it failed
    full = [_segment((140 * MiB, "active_allocated"), (10 * MiB, "inactive"))]
    assert not from_segments(full, 64 * MiB)["fragmented"]  # really in use
    assert not from_segments(pieces, None)["fragmented"]  # nothing says what was asked


def test_off_cuda_the_line_says_not_available() -> None:
    found = at_oom(MemoryError())
    assert set(found) == {"unavailable"}
    if not torch.cuda.is_available():
        assert found["unavailable"] == ("fragmentation at the OOM: not available on this "
                                        "device (CUDA was not in use)")


def test_a_strangers_cpu_oom_reports_that_fragmentation_is_not_available(tmp_path: Path
                                                                           ) -> None:
    script = tmp_path / "grow.py"
    script.write_text("import torch\nx = torch.ones(4)\nraise MemoryError('no room')\n")
    run = tmp_path / "run"
    done = nsadiag("run", "--out", str(run), "--", sys.executable, str(script),
                   cwd=tmp_path, env=checkout_env())
    assert done.returncode == 1, done.stderr[-2000:]
    finding = json.loads((run / "summary.json").read_text())["finding"]
    assert finding["verdict"] == "OOM"
    assert any(item["mark"] == "warn" and item["text"] ==
               "fragmentation at the OOM: not available on this device (CUDA was not in use)"
               for item in finding["results"])
    assert "not available on this device" in (run / "report.md").read_text()


def test_the_findings_sentence_says_fragmented_with_its_numbers() -> None:
    from types import SimpleNamespace

    from nsadiag.finding.trial import fragmentation_sentence

    pieces = [_segment((60 * MiB, "active_allocated"), (20 * MiB, "inactive")),
              _segment((30 * MiB, "inactive"), (10 * MiB, "active_allocated"))]

    def record(found: dict) -> SimpleNamespace:
        return SimpleNamespace(evidence=SimpleNamespace(result={"fragmentation": found}))

    mark, sentence = fragmentation_sentence(record(from_segments(pieces, 40 * MiB)))
    assert mark == "fail"
    assert sentence.startswith("fragmented: 50.0 MiB of the 120 MiB the allocator reserved "
                               "was free, but in pieces: the largest was 30.0 MiB, less than "
                               "the 40.0 MiB asked for")
    mark, sentence = fragmentation_sentence(record(from_segments(pieces, 90 * MiB)))
    assert (mark, sentence) == ("ok", "not fragmentation: 70.0 MiB of the 120 MiB reserved "
                                "was allocated, 50.0 MiB free (largest piece 30.0 MiB)")
    assert fragmentation_sentence(SimpleNamespace(evidence=None)) is None
