"""nsadiag ddp on the rank-divergent zoo entry (gloo, 2 ranks, CPU): STALL-COLLECTIVE that
names rank 1, whether the runner sees the stall first or the process-group timeout fires
first; no rank outlives the trial."""

import psutil

from nsadiag.finding import Finding
from nsadiag.finding.ddp import ddp_finding
from nsadiag.harness.jobs import run_ddp_trial
from nsadiag.report.ddp import build_ddp_report
from nsadiag.runmeta import RunMeta
from nsadiag.spec import TrialSpec
from repro import DDP_ZOO
from tests.readable import assert_readable

VERDICT, WORLD, SETTINGS = DDP_ZOO["rank_divergent"]


def _run(tmp_path, pg_timeout_s=None, **changes):
    # budget 60 s: a trial that ran longer would end as a budget kill, not this verdict
    spec = TrialSpec(target="repro.rank_divergent:make", out_dir=str(tmp_path / "trial"),
                     budget_s=60.0, **{**SETTINGS, **changes})
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    record = run_ddp_trial(spec, WORLD, "gloo", pg_timeout_s=pg_timeout_s)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before, "a launcher process outlived its trial"
    pids = [r["pid"] for r in record.evidence.ranks]
    assert len(pids) == WORLD and all(pids)
    assert not [pid for pid in pids if psutil.pid_exists(pid) and
                psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], "a rank survived"
    return record


def _assert_names_rank_1(record):
    assert record.verdict_name == VERDICT, record.verdict
    facts = record.verdict.facts
    assert facts.ranks.odd_ranks == [1]
    assert facts.ranks.diverged_at == 3  # step 0: bucket + loss; step 1: rank 1's extra first
    rows = {row.rank: row for row in facts.ranks.ranks}
    # the frame that issued it: the zoo entry's `dist.all_reduce(flagged, ...)` line
    assert rows[1].waiting.startswith("all_reduce #3 (1 tensor, group of 2 ranks, from "
                                         "forward (rank_divergent.py:")
    assert rows[1].position == "in blocks.1 forward of step 1"
    assert rows[0].waiting.startswith("all_reduce #3 (DDP bucket 0")
    assert "backward of step 1" in rows[0].position


def _runner_first(tmp_path):
    """A run in which the runner saw the stall first. Which side of the mismatched
    collectives gloo ends first is a race of the scenario: on a loaded machine gloo has
    once ended rank 0's collective ("remote worker crashing") before the stall clock
    fired, and once (CI, two test workers) ended it while the runner's stall clock had
    fired and its capture went on; the verdict then comes from the ranks' errors (the test
    below covers that path), so such a run is run once more."""
    record = _run(tmp_path / "first")
    if record.evidence.outcome.kill_reason != "stall" or record.verdict.facts.ranks.pg_timeout:
        record = _run(tmp_path / "again")
    return record


def test_runner_sees_the_stall_and_names_the_rank(tmp_path):
    record = _runner_first(tmp_path)
    _assert_names_rank_1(record)
    facts = record.verdict.facts
    assert facts.ranks.pg_timeout is False
    assert record.evidence.ddp.pg_timeout_outlasts_capture is True
    assert record.evidence.outcome.kill_reason == "stall"
    first = record.verdict.reasons[0]
    assert first.startswith("rank 1 waits in all_reduce #3") and "rank 0 waits in" in first
    # the report names the odd rank's collective: the line only rank 1 runs
    text, summary = build_ddp_report([record], RunMeta(), ddp_finding(record))
    finding = Finding.from_dict(summary["finding"])
    assert (finding.verdict, finding.kind) == ("STALL-COLLECTIVE", "stuck")
    assert "rank 1 issued all_reduce #3 here" in finding.culprit.why
    assert "collective #3 differs between ranks" in finding.proof
    assert_readable(text, finding, "repro/rank_divergent.py:44")


def test_process_group_timeout_still_reads_as_stall_collective(tmp_path):
    """A stall timeout far above the process-group timeout: gloo raises first, in each
    rank; the verdict is still STALL-COLLECTIVE with the positions, not a bare ERROR."""
    record = _run(tmp_path, pg_timeout_s=4.0, stall_timeout_s=40.0)
    _assert_names_rank_1(record)
    assert record.verdict.facts.ranks.pg_timeout is True
    assert record.evidence.ddp.pg_timeout_outlasts_capture is False
    text, _ = build_ddp_report([record], RunMeta(), ddp_finding(record))
    assert "4.0 s (shorter than the stall timeout plus the stack sampling" in text
    assert record.evidence.outcome.kill_reason is None  # the job ended by itself
    assert "gave up on a collective first" in record.verdict.reasons[0]
    assert "Timed out" in record.verdict.reasons[0]
