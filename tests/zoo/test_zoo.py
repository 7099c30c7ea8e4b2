"""The fault zoo diagnosed end to end: each entry gets the verdict its docstring states,
and no process of any trial outlives it."""

from pathlib import Path

import psutil

from nsadiag.checks import run_check
from nsadiag.finding import Finding
from nsadiag.harness.jobs import run_trial
from nsadiag.runmeta import RunMeta
from nsadiag.spec import TrialSpec
from repro import ZOO
from tests.helpers import REPRO, sweep_report
from tests.readable import assert_readable

QUICK = dict(seq_len=64, batch=2, steps=2, stall_timeout_s=3.0, budget_s=60.0)


def _diagnose(tmp_path, target, **changes):
    spec = TrialSpec(target=target, out_dir=str(tmp_path / "trial"), **{**QUICK, **changes})
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    record = run_trial(spec.validate())
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before, "a trial process outlived its trial"
    return record


def _reported(tmp_path, record):
    """The report of a sweep made of this one trial, and its finding."""
    run_dir = tmp_path / "report"
    run_dir.mkdir()
    text, summary = sweep_report(run_dir, [record], RunMeta(command_name="sweep-layers"))
    return text, Finding.from_dict(summary["finding"])


def _line(culprit):
    return culprit.file, culprit.line


def test_healthy_nsa_is_ok(tmp_path):
    record = _diagnose(tmp_path, "nsa", n_layers=2, overrides=dict(
        dim=32, n_heads=4, n_kv_heads=2, head_dim=8, l=8, d=4, l_sel=16, n_sel=3, w=16))
    assert record.verdict_name == "OK", record.verdict


def test_per_token_loop_is_slow_with_an_eta(tmp_path):
    # 20 s: a loaded 2-core machine spends ~6 s on start-up and a few more on the first
    # (counted) step of 2 x 256 tokens; 300 steps take minutes even on a fast machine, so
    # the budget always cuts the run after a step or more
    record = _diagnose(tmp_path, "repro.per_token_loop:make", n_layers=2, seq_len=256,
                       steps=300, budget_s=20.0, stall_timeout_s=5.0)
    assert record.verdict_name == "SLOW", record.verdict
    facts = record.verdict.facts
    assert facts.slow.rate > 0
    assert 0 < facts.slow.fraction_done < 1
    assert facts.slow.eta_s > 0  # the remainder at the measured pace


def test_a_forward_that_never_finishes_inside_a_per_token_loop_is_slow_by_defect(tmp_path):
    # the first forward at S=262144 runs its position loop for minutes: the budget cuts it
    # with no step and no forward finished, and the loop counter gives position and pace
    record = _diagnose(tmp_path, "repro.sequential_prefill:make",
                       **ZOO["sequential_prefill"][1])
    assert record.evidence.event_counts.get("step", 0) == 0
    assert record.verdict_name == "SLOW", record.verdict
    facts, reasons = record.verdict.facts, record.verdict.reasons
    assert facts.slow.slow_by == "defect"
    source = REPRO / "sequential_prefill.py"
    line = next(i for i, text in enumerate(source.read_text().splitlines(), 1)
                if text.strip().startswith("for t in range(S)"))
    assert any(r.startswith(f"slow by defect: a per-token loop at repro/sequential_prefill.py:"
                            f"{line} (loop variable `t` in _forward_prefill_sequential")
               for r in reasons), reasons
    position = facts.slow.loop_position
    assert position["variable"] == "t" and position["end"] == 262144
    assert 0 < position["last"] < 262144 and position["eta_s"] > 0
    assert position["module"] == "blocks.0" and position["phase"] == "forward"
    assert "sampler.py" not in " ".join(reasons)  # nsadiag's own frames are never the user's


def _longest_quiet_s(events: list[dict]) -> float:
    """The longest time between two heartbeat events (pulses left out): how long the run
    went without a module, step or phase event."""
    times = [event["t"] for event in events if event["kind"] != "pulse"]
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


def test_a_loop_inside_one_module_outlasting_the_stall_timeout_is_slow(tmp_path):
    # one block at S=8192: its forward is a loop of 8192 token steps and its backward
    # about 8192 x 8 autograd nodes, each seconds long with no module event inside it;
    # the sampler's pulses (a loop iterating, autograd nodes running) are the progress
    record = _diagnose(tmp_path, "repro.long_token_loop:make",
                       **ZOO["long_token_loop"][1])
    events = record.evidence.events
    assert _longest_quiet_s(events) > 2.0, "no module call outlasted the stall timeout"
    assert record.verdict_name == "SLOW", record.verdict
    assert any(pulse.get("progress") for pulse in record.evidence.pulses)
    facts = record.verdict.facts
    assert "per_token_loop.py" in facts.hot.hot_line
    # the hot frame is the loop's line from the sampled profile, with its share
    assert facts.hot.hot_frame == facts.hot.hot_line and 0 < facts.hot.hot_share <= 1
    assert facts.hot.loop["variable"] == "t" and facts.hot.loop["advanced"] > 0
    # a read and a handful of tiny ops per token: slow by defect, whatever the load (from
    # the counted first forward, or, where a loaded machine did not finish that forward in
    # the budget, from the loop counter over the positions)
    assert facts.slow.slow_by == "defect", record.verdict.reasons
    assert any("a read per token" in finding or
               finding.startswith("a per-token loop at repro/per_token_loop.py:")
               for finding in facts.slow.slow_findings), facts.slow.slow_findings
    flame = (Path(record.trial_dir) / "profile.folded").read_text().splitlines()
    assert any("per_token_loop.py" in line for line in flame)
    # the line is the per-token loop the counter iterated, not the hottest healthy line
    text, finding = _reported(tmp_path, record)
    assert (finding.verdict, finding.kind) == ("SLOW", "slow by defect")
    assert finding.culprit.code.startswith("for t in range(x.shape[1]):")
    # the proof is whichever of the two counts decided it (above): the host reads of the
    # counted forward, or the loop counter over the positions
    assert "host reads" in finding.proof or finding.proof.startswith(
        "a per-token loop at repro/per_token_loop.py:"), finding.proof
    assert "per-token Python loop" in finding.next_action
    assert_readable(text, finding, "repro/per_token_loop.py:26-30")


def test_a_python_spin_that_never_progresses_is_stall_busy(tmp_path):
    record = _diagnose(tmp_path, "repro.python_spin:make")
    assert record.verdict_name == "STALL-BUSY", record.verdict
    assert record.verdict.facts.stall.demand > 0.5
    assert "python_spin.py" in str(record.verdict.facts.hot.hot_frame)
    _, finding = _reported(tmp_path, record)  # the `while` it spins in, whole
    assert finding.culprit.where() == "repro/python_spin.py:24-25", finding.culprit


def test_lock_in_backward_hook_is_a_deadlock(tmp_path):
    record = _diagnose(tmp_path, "repro.lock_deadlock:make")
    assert record.verdict_name == "DEADLOCK", record.verdict
    assert "_wait_for_lock" in " ".join(record.verdict.reasons)
    assert record.evidence.stall.stacks_class == "waiting"
    text, finding = _reported(tmp_path, record)
    assert (finding.verdict, finding.kind) == ("DEADLOCK", "stuck")
    assert finding.culprit.code == "with _LOCK:" and "`_LOCK`" in finding.next_action
    assert_readable(text, finding, "repro/lock_deadlock.py:26")


def test_long_native_op_is_stall_busy(tmp_path):
    record = _diagnose(tmp_path, "repro.native_stall:make")
    assert record.verdict_name == "STALL-BUSY", record.verdict
    assert "GrindingBlock" in str(record.verdict.facts) or \
        "forward" in str(record.verdict.facts.hot.hot_frame)
    _, finding = _reported(tmp_path, record)
    assert _line(finding.culprit) == ("repro/native_stall.py", 24), finding.culprit


def test_exception_in_backward_is_an_error(tmp_path):
    record = _diagnose(tmp_path, "repro.backward_error:make")
    assert record.verdict_name == "ERROR", record.verdict
    assert "RuntimeError" in record.verdict.reasons[0]
    assert "gradient buffer layout mismatch" in " ".join(record.verdict.reasons)
    _, finding = _reported(tmp_path, record)
    assert (finding.kind, _line(finding.culprit)) == ("crashed", ("repro/backward_error.py", 21))


def test_segfault_is_a_crash(tmp_path):
    record = _diagnose(tmp_path, "repro.hard_crash:make")
    assert record.verdict_name == "CRASH", record.verdict
    assert "SIGSEGV" in " ".join(record.verdict.reasons)
    _, finding = _reported(tmp_path, record)  # the user frame of the faulthandler dump
    assert (finding.kind, _line(finding.culprit)) == ("crashed", ("repro/hard_crash.py", 18))


def test_dense_masks_run_out_of_memory_under_a_cap(tmp_path):
    """The same cap holds S=512 easily; S=4096 needs ~64x the attention memory."""
    cap = 5 * 2**30 // 4
    small = _diagnose(tmp_path / "small", "repro.dense_masks:make", seq_len=512, batch=1,
                      memory_cap_bytes=cap)
    assert small.verdict_name == "OK", small.verdict
    large = _diagnose(tmp_path / "large", "repro.dense_masks:make", seq_len=4096, batch=1,
                      memory_cap_bytes=cap)
    assert large.verdict_name == "OOM", large.verdict


def test_verdict_still_comes_without_py_spy(tmp_path, monkeypatch):
    """No stacks (py-spy missing or ptrace refused): the verdict comes from heartbeats and
    /proc, and the evidence says what was unavailable and why."""
    from nsadiag.probes import stacks

    monkeypatch.setattr(stacks, "capture", lambda *a, **k: "py-spy: not found on PATH")
    record = _diagnose(tmp_path, "repro.lock_deadlock:make")
    assert record.verdict_name == "DEADLOCK", record.verdict
    assert "py-spy: not found on PATH" in record.evidence.stall.unavailable
    assert any("stacks unavailable" in reason for reason in record.verdict.reasons)


def test_late_bound_checkpoint_closure_is_wrong_through_the_ckpt_check(tmp_path):
    """A plain trial of this entry finishes and looks healthy; its ZOO settings name the
    check that sees the defect."""
    expected, settings = ZOO["late_bound_ckpt"]
    settings = dict(settings)
    check = settings.pop("check")
    spec = TrialSpec(target="repro.late_bound_ckpt:make", out_dir=str(tmp_path / "trial"),
                     **{**QUICK, **settings}).validate()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    result = run_check(check, spec, tmp_path)
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert result.verdict.name == expected == "WRONG", result.summary
    assert result.module == "blocks.0"
    assert "recompute of blocks.0 ran blocks.3's parameters" in result.summary
