"""nsadiag.probes.profile: the summary of a sampled profile, on a hand-written profile and on
one the sampler wrote while a loop in a user file ran."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nsadiag.probes.profile import (
    counts_by_one,
    describe,
    folded,
    read_profile,
    summarize,
    tables,
)
from nsadiag.probes.sampler import PROFILE_VERSION, Sampler

USER = "/home/user/proj/model.py"
TORCH = "/usr/lib/python3.11/site-packages/torch/nn/functional.py"


def _profile() -> dict:
    outer = ["train", "/home/user/proj/train.py", 10]
    return {
        "version": PROFILE_VERSION, "pid": 1, "interval_s": 0.1, "first_t": 100.0,
        "last_t": 130.0, "samples": 10,
        "stacks": [
            {"frames": [outer, ["attend", USER, 42], ["softmax", TORCH, 7]], "code": None,
             "phase": "forward", "module": "blocks.0", "op": None, "count": 6},
            {"frames": [outer, ["attend", USER, 43]], "code": None, "phase": "forward",
             "module": "blocks.0", "op": None, "count": 3},
            {"frames": [["_engine_run_backward", TORCH, 9]], "code": None,
             "phase": "backward", "module": None, "op": "MmBackward0", "count": 1},
        ],
        "loops": [
            # a per-token loop entered once per layer: rose 20 + 10 times, restarted once
            {"function": "attend", "file": USER, "line": 42, "variable": "t",
             "first": [100.0, 0], "last": [130.0, 80], "observations": 32, "advanced": 240,
             "advancing_s": 28.0, "restarts": 1},
            # changed twice only: a value, not a loop counter
            {"function": "attend", "file": USER, "line": 42, "variable": "n",
             "first": [100.0, 4], "last": [110.0, 5], "observations": 3, "advanced": 2,
             "advancing_s": 10.0, "restarts": 0},
            # fell more often than it rose: not a loop counter either
            {"function": "attend", "file": USER, "line": 42, "variable": "j",
             "first": [100.0, 0], "last": [130.0, 3], "observations": 31, "advanced": 40,
             "advancing_s": 15.0, "restarts": 20},
        ],
    }


def test_hot_lines_are_the_innermost_user_frames_counted():
    summary = summarize(_profile())
    assert summary["samples"] == 10 and summary["duration_s"] == pytest.approx(30.0)
    assert summary["phases"] == {"forward": 9, "backward": 1}
    hot = summary["hot_lines"]
    assert [(h["where"], h["count"]) for h in hot] == [("attend (model.py:42)", 6),
                                                       ("attend (model.py:43)", 3)]
    assert hot[0]["fraction"] == pytest.approx(0.6)


def test_loop_counters_are_kept_and_values_that_are_not_counters_dropped():
    summary = summarize(_profile())
    loops = summary["loops"]
    assert len(loops) == 1
    loop = loops[0]
    assert loop["variable"] == "t" and loop["where"] == "attend (model.py:42)"
    assert (loop["advanced"], loop["restarts"], loop["last"]) == (240, 1, 80)
    assert loop["rate_per_s"] == pytest.approx(240 / 28.0)
    assert summary["backward_ops"] == [{"op": "MmBackward0", "count": 1}]
    assert describe(summary) == [
        "sampled profile: 10 stacks over 30 s (forward 90%, backward 10%)",
        # 6 of the 9 forward samples: the line's share of the phase it runs in
        "hottest line of user code: attend (model.py:42) in 60% of the samples (67% of the "
        "forward samples)",
        "busiest backward op: MmBackward0 in 100% of the backward samples",
        "loop variable `t` in attend (model.py:42) advanced 240 at 8.6/s, restarted 1 "
        "times: a loop iterating"]


def test_frames_by_inclusive_and_self_share_put_the_users_code_first():
    profile = _profile()
    harness = ["run_step", "/repo/nsadiag/harness/trial.py", 300]  # on every stack
    for entry in profile["stacks"]:
        entry["frames"] = [harness, *entry["frames"]]
    frames = summarize(profile)["frames"]
    # train:10 is on 9 of 10 stacks; attend:42 on 6 (calling softmax), attend:43 on 3 and
    # innermost there; softmax, a library line with the largest self share, comes after
    # the user's lines; nsadiag's own frame is left out
    assert [(f["where"], f["user"], f["inclusive"], f["self"]) for f in frames] == [
        ("train (train.py:10)", True, 9, 0), ("attend (model.py:42)", True, 6, 0),
        ("attend (model.py:43)", True, 3, 3), ("softmax (functional.py:7)", False, 6, 6),
        ("_engine_run_backward (functional.py:9)", False, 1, 1)]
    assert frames[0]["inclusive_share"] == pytest.approx(0.9)
    assert frames[2]["self_share"] == pytest.approx(0.3)
    lines = tables(summarize(profile))
    assert "| attend (model.py:43) | user | 30% | 30% |" in lines
    assert "| softmax (functional.py:7) | library | 60% | 60% |" in lines
    assert tables({"samples": 0}) == [] and tables(None) == []


def test_backward_time_goes_to_the_module_whose_backward_runs_and_names_the_op():
    profile = _profile()
    backward = profile["stacks"][2]
    profile["stacks"][2:] = [
        {**backward, "module": "blocks.1", "op": "MmBackward0", "count": 3},
        {**backward, "module": "blocks.0", "op": None, "count": 1}]
    profile["samples"] = 13
    summary = summarize(profile)
    assert summary["backward_modules"] == [
        {"module": "blocks.1", "op": "MmBackward0", "count": 3, "share": 0.75},
        {"module": "blocks.0", "op": None, "count": 1, "share": 0.25}]
    assert summary["backward_by_module"] == [
        {"module": "blocks.1", "count": 3, "share": 0.75, "op": "MmBackward0",
         "op_share": 0.75},
        {"module": "blocks.0", "count": 1, "share": 0.25, "op": None, "op_share": 0.0}]
    assert ("in backward, 75% of the samples fell in the backward of blocks.1 (busiest op "
            "MmBackward0, 75%)") in describe(summary)
    lines = tables(summary)
    assert "| blocks.1 | MmBackward0 | 75% |" in lines and "| blocks.0 | - | 25% |" in lines


def test_with_the_source_at_hand_a_loop_target_counts_even_when_sampled_sparsely(tmp_path):
    # a short forward sampled twice per call: as many falls as rises, but the source says
    # `t` is a for target; `width` changed as often and is a plain assignment
    source = tmp_path / "attn.py"
    source.write_text("def forward(x):\n"
                      "    width = x.shape[1]\n"
                      "    for t in range(width):\n"
                      "        pass\n"
                      "    total = 0\n"
                      "    while total < 9:\n"
                      "        total += 1\n")
    reading = {"function": "forward", "file": str(source), "line": 4, "first": [0.0, 0],
               "last": [10.0, 5], "observations": 41, "advanced": 2000, "advancing_s": 5.0,
               "restarts": 20}
    loops = summarize({**_profile(), "loops": [
        {**reading, "variable": "t"}, {**reading, "variable": "width", "advanced": 1000},
        {**reading, "variable": "total", "advanced": 500}]})["loops"]
    assert [loop["variable"] for loop in loops] == ["t", "total"]


def test_the_source_says_which_loop_counters_count_iterations(tmp_path):
    source = tmp_path / "loops.py"
    source.write_text("def forward(x, S):\n"
                      "    for t in range(S):\n"
                      "        pass\n"
                      "    for i, row in enumerate(x):\n"
                      "        pass\n"
                      "    for start in range(0, S, 64):\n"
                      "        pass\n"
                      "    for j in range(0, S, 1):\n"
                      "        pass\n"
                      "    n = 0\n"
                      "    while n < S:\n"
                      "        n += 1\n"
                      "    m = 0\n"
                      "    m += 8\n")
    by_one = {v: counts_by_one(str(source), "forward", v) for v in "t i start j n m".split()}
    assert by_one == {"t": True, "i": True, "start": False, "j": True, "n": True, "m": False}
    assert counts_by_one(str(tmp_path / "gone.py"), "forward", "t") is None


def test_the_folded_stacks_put_phase_and_op_at_the_root():
    lines = folded(_profile()).splitlines()
    assert lines == [
        "[forward];train (train.py:10);attend (model.py:42);softmax (functional.py:7) 6",
        "[forward];train (train.py:10);attend (model.py:43) 3",
        "[backward];[MmBackward0];_engine_run_backward (functional.py:9) 1"]
    assert folded({"stacks": []}) == ""


def test_a_missing_torn_or_foreign_profile_reads_as_none(tmp_path: Path):
    assert read_profile(tmp_path / "absent.json") is None
    (tmp_path / "torn.json").write_text('{"version": 1, "stacks": [')
    assert read_profile(tmp_path / "torn.json") is None
    (tmp_path / "other.json").write_text('{"version": 999}')
    assert read_profile(tmp_path / "other.json") is None


def test_the_sampler_profile_of_a_running_loop_names_the_loop(tmp_path: Path):
    source = tmp_path / "user_model.py"
    source.write_text(
        "import time\n"
        "def prefill(n):\n"
        "    total = 0\n"
        "    for token in range(n):\n"
        "        time.sleep(0.01)\n"
        "        total += token\n"
        "    return total\n")
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    profile_path = tmp_path / "profile.json"
    pulses: list[dict] = []
    sampler = Sampler(pulses.append, profile_path, interval_s=0.02, pulse_s=0.2,
                      main=threading.current_thread())
    sampler.start()
    try:
        namespace["prefill"](80)
        namespace["prefill"](80)  # entered again: the counter restarts
    finally:
        sampler.stop()
    summary = summarize(read_profile(profile_path))
    assert summary["samples"] > 0
    assert summary["hot_lines"][0]["where"].startswith("prefill (user_model.py:")
    loop = next(loop for loop in summary["loops"] if loop["variable"] == "token")
    assert loop["advanced"] > 0 and loop["rate_per_s"] > 0 and loop["restarts"] <= 1
    assert any(pulse["progress"] for pulse in pulses)
    assert not sampler.is_alive()


def _ledger(holders: list[tuple[list, int, int, int, int]]) -> dict:
    return {"version": PROFILE_VERSION, "pid": 1, "interval_s": 0.1, "samples": 0,
            "stacks": [], "memory": {"rss": {
                "first": 0, "last": 1 << 30, "peak": 1 << 30, "held": 1 << 30,
                "holders": [{"frame": frame, "held": held, "steps": steps, "rose": rose,
                             "depth": depth} for frame, held, steps, rose, depth in holders]}}}


SCRIPT = "/home/user/proj/leak.py"


def test_the_line_holding_most_memory_is_named_when_sparse_readings_gave_part_to_its_caller():
    # a ledger of a loaded machine: readings far apart gave a third of what the validation
    # line kept to the module-level call around it only (the frames on both stacks)
    profile = _ledger([(["<module>", SCRIPT, 38], 1137627136, 24, 1316872192, 0),
                       (["main", SCRIPT, 32], 672546816, 22, 701775872, 1),
                       (["main", SCRIPT, 23], 173645824, 1, 173645824, 1),
                       (["main", SCRIPT, 28], 67784704, 16, 67784704, 1)])
    holder = summarize(profile)["memory"]["rss"]["holder"]
    assert (holder["where"], holder["held"]) == ("main (leak.py:32)", 672546816)


def test_a_line_holding_more_than_the_lines_beside_it_is_named_under_a_caller_holding_more():
    # a ledger of a heavily loaded machine: the heap growth the kept tensors forced showed
    # partly under the backward and the optimizer step (which gave most of theirs back) and
    # partly under the caller only; the validation line holds a third of what its caller
    # holds, and more than the other lines of the loop together
    profile = _ledger([(["<module>", SCRIPT, 38], 978 << 20, 21, 1060 << 20, 0),
                       (["main", SCRIPT, 32], 351 << 20, 16, 351 << 20, 1),
                       (["main", SCRIPT, 30], 144 << 20, 8, 335 << 20, 1),
                       (["main", SCRIPT, 29], 100 << 20, 6, 164 << 20, 1),
                       (["main", SCRIPT, 28], 38 << 20, 11, 38 << 20, 1)])
    assert summarize(profile)["memory"]["rss"]["holder"]["where"] == "main (leak.py:32)"
    # the same, with a line beside it keeping as much: no line is named over the caller
    kept_beside = _ledger([(["<module>", SCRIPT, 38], 978 << 20, 21, 1060 << 20, 0),
                           (["main", SCRIPT, 32], 351 << 20, 16, 351 << 20, 1),
                           (["main", SCRIPT, 28], 351 << 20, 16, 351 << 20, 1)])
    assert summarize(kept_beside)["memory"]["rss"]["holder"]["where"] == \
        "<module> (leak.py:38)"


def test_no_line_holding_half_names_the_frame_around_them():
    # two lines of one loop each keep a part: neither holds the majority, the loop's caller
    # holding both is named
    profile = _ledger([(["train", SCRIPT, 50], 1000, 10, 1000, 0),
                       (["step", SCRIPT, 20], 450, 10, 450, 1),
                       (["step", SCRIPT, 21], 450, 10, 450, 1)])
    assert summarize(profile)["memory"]["rss"]["holder"]["where"] == "train (leak.py:50)"


def test_a_line_hot_only_while_the_model_was_built_has_no_share_once_it_was():
    # a stuck script: its optimizer's construction on the CPU before training, then a wait
    build = ["main", "/home/user/proj/train.py", 51]
    join = ["main", "/home/user/proj/train.py", 62]
    profile = {"version": PROFILE_VERSION, "pid": 1, "interval_s": 0.1, "first_t": 100.0,
               "last_t": 112.0, "samples": 119,
               "stacks": [{"frames": [build], "count": 38, "phase": "build", "on_cpu": 38},
                          {"frames": [join], "count": 81, "phase": "forward", "on_cpu": 0}],
               "loops": []}
    summary = summarize(profile)
    (line, *_) = summary["hot_lines"]
    assert line["where"] == "main (train.py:51)" and line["phase"] == "build"
    assert line["training_fraction"] == 0.0  # none of its samples came once it was built
    said = " ".join(describe(summary))
    assert "(0% once the model was built; 100% of the build samples)" in said, said
