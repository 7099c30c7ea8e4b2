"""Strangers' DDP scripts that stall in a collective (repro/scripts/), through `nsadiag
run`: the chain names every rank's place and step count, and the Next follows from what
the ranks that hold the others up are doing (never "runs on some ranks only" when the odd
rank issued nothing)."""

from __future__ import annotations

import sys

from tests.helpers import SCRIPTS
from tests.zoo.test_run_scripts import _line, nsadiag_run


def _torchrun(tmp_path, script: str) -> tuple[dict, dict]:
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--stall-timeout", "6"],
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(SCRIPTS / script)])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "STALL-COLLECTIVE", summary["headline"]
    return summary, record["verdict"]["facts"]


def test_uneven_data_names_the_step_counts_and_asks_for_the_same_number_of_steps(tmp_path):
    summary, facts = _torchrun(tmp_path, "ddp_uneven_data.py")
    chain = facts["wait_chain"]
    barrier = _line("ddp_uneven_data.py", "dist.barrier()", exact=True)
    assert chain["end"] == "uneven-steps"
    assert facts["steps_done"] == {"0": 4, "1": 4}
    assert chain["printed"].startswith("rank 0 waits in all_reduce #5 (DDP bucket 0, ")
    assert "the gradients of step 4" in chain["printed"]
    assert chain["printed"].endswith(f"-> rank 1 never began step 4: it ran 4 steps and waits "
                                     f"in barrier #5 (0 tensors, default group, from main "
                                     f"(ddp_uneven_data.py:{barrier})) at "
                                     f"ddp_uneven_data.py:{barrier}")
    said = summary["finding"]["next_action"]
    assert said.startswith("Give every rank the same number of steps: the ranks' steps differ "
                           "(rank 0 began 5, rank 1 ran 4), so a rank waits after its last step")
    assert "a `DistributedSampler` with `drop_last=True`, or DDP's `join` context" in said
    assert "some ranks only" not in said


def test_a_rank_that_polls_instead_of_joining_is_followed_to_its_loop(tmp_path):
    summary, facts = _torchrun(tmp_path, "ddp_rank_polls_file.py")
    chain = facts["wait_chain"]
    loop = _line("ddp_rank_polls_file.py", "while not os.path.exists(marker):", exact=True)
    assert chain["end"] == "poll" and facts["rank_chain"]["rank"] == 1
    assert f"-> rank 1 never issued #1 -> rank 1: the main thread polls `not " \
           f"os.path.exists(marker)` in a sleep loop at ddp_rank_polls_file.py:{loop}" \
           in chain["printed"]
    culprit = summary["finding"]["culprit"]
    # rank 1 issued nothing: the line it stands at is never said to be a collective it issued
    assert "issued" not in culprit["why"].split(" and never issued")[0], culprit["why"]
    assert culprit["why"].startswith("rank 1 stands here and never issued collective #1")
    said = summary["finding"]["next_action"]
    assert said.startswith(f"On rank 1: add a timeout to the polling loop at "
                           f"ddp_rank_polls_file.py:{loop}")
    assert "some ranks only" not in said
