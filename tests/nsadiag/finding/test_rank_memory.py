"""A rank whose memory grows per step while the others' does not
(nsadiag.finding.rank_memory), named with the line that keeps it: by hand, and on a
stranger's two-rank torchrun job run unchanged under `nsadiag run`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from nsadiag.finding import Culprit
from nsadiag.finding.rank_memory import growing_ranks
from nsadiag.verdictfacts import RankRow
from tests.helpers import FIXTURES, checkout_env, nsadiag

MiB = 2**20


def _row(rank: int, growth: float | None, holder: str | None = None) -> RankRow:
    return RankRow(rank=rank, host=f"node{rank // 2}", local_rank=rank % 2, node_rank=rank // 2,
                   pid=100 + rank, state="finished", issued=10, last_collective=None,
                   waiting=None, waiting_since_s=None, position=None, cpu_fraction=None,
                   collective=None, user_frame=None, memory_per_step=growth,
                   memory_holder=holder, folded=None, raw={})


def test_the_one_rank_that_outgrows_the_others_is_named_with_its_line() -> None:
    rows = [_row(0, 0.05 * MiB), _row(1, 3 * MiB, "train (train.py:40)"),
            _row(2, 0.1 * MiB), _row(3, None)]
    kept = Culprit("train.py", 44, "appends", code="cache.append(out)", retains="cache")
    found = growing_ranks(rows, lambda holder, growth: kept if holder.endswith(":40)") else None)
    assert found == ["rank 1 on node0: memory grew 3.00 MiB per step, the other ranks' median "
                     "76.8 KiB per step; `cache` keeps it: train.py:44 `cache.append(out)` "
                     "appends to it in every pass of its loop"]
    assert growing_ranks(rows) == ["rank 1 on node0: memory grew 3.00 MiB per step, the other "
                                   "ranks' median 76.8 KiB per step; its profile saw the "
                                   "memory rise under train (train.py:40)"]


def test_no_rank_is_named_when_all_grow_alike_or_none_grows_much() -> None:
    assert growing_ranks([_row(0, 3 * MiB), _row(1, 3.2 * MiB), _row(2, 2.9 * MiB)]) == []
    assert growing_ranks([_row(0, 0.0), _row(1, 0.5 * MiB)]) == []  # under a MiB a step
    assert growing_ranks([_row(0, 5 * MiB)]) == []  # one rank: no others to compare


def test_a_strangers_torchrun_job_names_the_rank_and_its_append(tmp_path: Path) -> None:
    own = tmp_path / "their-project"
    own.mkdir()
    shutil.copy(FIXTURES / "memory" / "rank_keeps_activations.py", own / "train_ddp.py")
    run = tmp_path / "run"
    done = nsadiag("run", "--out", str(run), "--", sys.executable, "-m",
                   "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   "train_ddp.py", cwd=own, env=checkout_env())
    assert done.returncode == 0, done.stderr[-2000:]
    finding = json.loads((run / "summary.json").read_text())["finding"]
    grown = [item["text"] for item in finding["results"] if "memory grew" in item["text"]]
    assert len(grown) == 1 and grown[0].startswith("rank 1 on ")
    assert "`debug_activations` keeps it: train_ddp.py:19 " \
           "`debug_activations.append(torch.randn(512, 512))" in grown[0]
    assert "| memory / step |" in (run / "report.md").read_text()
