"""trials.jsonl bookkeeping and report ordering, without running trials."""

from nsadiag.finding import Finding
from nsadiag.finding.commands import reproduce
from nsadiag.harness.machine import cgroup_oom_kills
from nsadiag.rundir import TrialRecord, append_record, load_records, next_trial_index
from nsadiag.runmeta import RunMeta
from tests.helpers import plain_spec, sweep_report, trial_record


def _record(n_layers: int, verdict: str, trial_dir: str, **spec) -> TrialRecord:
    """A two-step trial whose second step takes ``n_layers`` seconds; ``spec`` changes
    fields of its spec."""
    result = {"step_s": [1.0, float(n_layers)], "forward_s": [0.5, 0.5],
              "backward_s": [0.5, 0.5], "steps_done": 2, "peak_rss": 1000}
    return trial_record(plain_spec(n_layers, **spec), result, verdict, trial_dir)


def test_a_torn_last_line_does_not_swallow_the_next_record(tmp_path):
    path = tmp_path / "trials.jsonl"
    append_record(path, _record(1, "OK", "trial-0"))
    with open(path, "a") as f:
        f.write('{"spec": {"n_la')  # a writer killed mid-line
    append_record(path, _record(2, "OK", "trial-2"))
    assert [r.spec.n_layers for r in load_records(path)] == [1, 2]


def test_new_trials_never_reuse_an_existing_directory(tmp_path):
    assert next_trial_index(tmp_path) == 0
    (tmp_path / "trial-0").mkdir()
    (tmp_path / "trial-3").mkdir()
    assert next_trial_index(tmp_path) == 4


def test_the_threshold_is_the_smallest_failing_depth_whatever_the_file_order(tmp_path):
    records = [_record(8, "SLOW", "trial-0"), *(_record(n, "OK", f"trial-{n}")
                                                 for n in (1, 2, 3)), _record(6, "SLOW", "t6")]
    text, summary = sweep_report(tmp_path, records, RunMeta(command_name="sweep-layers"))
    assert summary["threshold"] == 6
    finding = Finding.from_dict(summary["finding"])
    assert finding.verdict == "SLOW" and finding.headline.endswith("at 6 layers")
    assert text.startswith(f"# nsadiag sweep-layers: ❌ {finding.headline}")
    assert [r["n_layers"] for r in summary["rows"]] == [1, 2, 3, 6, 8]


def test_reproduction_carries_every_setting_of_the_failing_trial():
    record = _record(3, "OOM", "t", device="cuda", memory_cap_bytes=3 * 2**30, seed=7,
                     branches=["sel"], overrides={"branches_unused": [1, 2], "dim": 64})
    command = " ".join(reproduce(record.spec))
    for piece in ("isolate-branch sel", "--device cuda", "--memory-cap-mb 3072", "--seed 7",
                  "--set dim=64", "--set branches_unused=1,2", "--layers 3"):
        assert piece in command


def test_oom_kill_counter_reads_cgroup_v2_format(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    assert cgroup_oom_kills(events) == 2
    assert cgroup_oom_kills(tmp_path / "missing") is None
