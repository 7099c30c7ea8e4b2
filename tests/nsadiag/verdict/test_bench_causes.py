"""bench/bench_verdicts.py's "cause right" column on fixed findings (the bench itself runs
every entry and stays out of the suite): cause_of reads the cause a finding printed in the
words of the entries' stated causes, and the table's percentiles are nearest-rank."""

import os
import sys
from pathlib import Path

import pytest

from nsadiag.verdict.waits import ENDS
from tests.helpers import REPO

sys.path.insert(0, str(REPO / "bench"))
from bench_verdicts import (  # noqa: E402
    CAUSES,
    PROMPTS,
    SCRIPT_ENV,
    SCRIPT_RUNS,
    SCRIPTS,
    _drive,
    cause_of,
    cause_table,
    percentile,
)


@pytest.mark.parametrize(("verdict", "finding", "facts", "cause"), [
    # a stuck run: the end of its wait chain, whatever its culprit says
    ("DEADLOCK", {"culprit": {"host_read": "4 `x.item()`"}},
     {"wait_chain": {"end": "pipe-eof", "printed": "waits for ..."}}, "pipe-eof"),
    ("STALL-COLLECTIVE", {}, {"wait_chain": {"end": "uneven-steps"}}, "uneven-steps"),
    # a SLOW: per-token host reads by the loop's body or by the counts, else by size
    ("SLOW", {"culprit": {"host_read": "4 `x.item()`"}}, {"slow_by": None},
     "per-token host reads"),
    ("SLOW", {"culprit": None}, {"slow_by": "defect"}, "per-token host reads"),
    ("SLOW", {}, {"slow_by": "size"}, "slow by size"),
    ("SLOW", {"culprit": {"host_read": None}}, {"slow_by": None}, "none"),
    # else the slow cause's class, as the finding says it beside SLOW
    ("SLOW", {}, {"slow_by": None, "slow_cause": {"kind": "data-bound", "share": 0.97}},
     "data-bound"),
    ("SLOW", {}, {"slow_by": "size", "slow_cause": {"kind": "recompiles"}}, "recompiles"),
    ("SLOW", {"culprit": {"host_read": "4 `x.item()`"}},
     {"slow_by": "defect", "slow_cause": {"kind": "checkpoint-recompute"}},
     "per-token host reads"),
    # memory: what retains it, else growth with a holder, else a peak
    ("OOM", {"culprit": {"retains": "history"}}, {"rss_growth_per_step": 5e6}, "retains history"),
    ("OOM", {}, {"rss_growth_per_step": 5e6, "rss_holder": "model.py:9"},
     "memory grows per step"),
    ("OOM", {}, {"rss_growth_per_step": 0}, "peak memory"),
    ("CRASH", {}, {"diverged_at": 4, "signal_name": "SIGABRT"}, "collective mismatch"),
    ("CRASH", {}, {"signal_name": "SIGSEGV"}, "signal SIGSEGV"),
    ("CRASH", {}, {}, "none"),
    ("ERROR", {}, {"exception_type": "RuntimeError"}, "raises RuntimeError"),
    ("STALL-BUSY", {}, {"stacks_class": "busy-native"}, "busy-native"),
    ("WRONG", {}, {"check": "ckpt"}, "ckpt check"),
    ("OK", {}, {}, "none"),
])
def test_the_printed_cause_in_the_stated_causes_words(verdict, finding, facts, cause):
    assert cause_of(verdict, finding, facts) == cause


def test_every_entry_states_a_cause_cause_of_can_print():
    sys.path.insert(0, str(REPO))
    from repro import ZOO

    assert set(CAUSES) == set(ZOO) | set(SCRIPT_RUNS)
    printable = {*ENDS, "per-token host reads", "peak memory", "collective mismatch", "none",
                 "busy-native", "busy-python", "ckpt check", "raises RuntimeError",
                 "signal SIGSEGV", "data-bound", "recompiles", "checkpoint-recompute"}
    assert {c for c in CAUSES.values() if not c.startswith("retains ")} <= printable


def test_percentiles_are_nearest_rank_and_the_table_counts_right_causes():
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert percentile([float(n) for n in range(1, 11)], 0.9) == 9.0
    assert percentile([7.0], 0.9) == 7.0
    rows = [{"entry": "backward_error", "kind": "zoo", "got": "ERROR", "seconds": 5.0,
             "cause": "raises RuntimeError", "cause_right": True},
            {"entry": "poll_for_file.py", "kind": "script", "got": "DEADLOCK", "seconds": 20.0,
             "cause": "unknown", "cause_right": False}]
    lines = cause_table({"quiet": {"burners": 0, "load": [1.0, 2.5], "rows": rows}})
    assert lines[2] == "| backward_error | raises RuntimeError | ERROR | yes | 5.0 s |"
    assert lines[3] == ("| scripts/poll_for_file.py | poll | DEADLOCK | no (unknown) | "
                        "20.0 s |")
    assert lines[-1] == ("- no added load (load 2.5): cause right 1 of 2; time to verdict p50 "
                         "5.0 s, p90 20.0 s.")


def test_every_script_of_repro_scripts_is_an_entry_or_the_helper_an_entry_names():
    scripts = {path.name for path in SCRIPTS.iterdir() if path.suffix in (".py", ".sh")}
    helpers = {Path(value).name for env in SCRIPT_ENV.values() for value in env.values()}
    assert scripts - helpers == set(SCRIPT_RUNS)
    assert set(PROMPTS) <= set(SCRIPT_RUNS)


def test_a_prompt_is_answered_once_it_has_waited_and_its_answer_read():
    # the question written without a newline, as input() writes it; the answer typed once
    ask = ("import sys; sys.stdout.write('overwrite it? [y/N] '); sys.stdout.flush(); "
           "print('got', repr(sys.stdin.readline()))")
    code, output = _drive([sys.executable, "-c", ask], dict(os.environ),
                          ("overwrite it? [y/N]", "n\n"), 0.0, 120)
    assert code == 0 and "got 'n\\n'" in output, output
    code, output = _drive([sys.executable, "-c", "print('no question')"], dict(os.environ),
                          None, 0.0, 120)
    assert code == 0 and output == "no question\n"
