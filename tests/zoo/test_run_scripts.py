"""The plain-script zoo (repro/scripts/) through `nsadiag run`: each script gets the
verdict its docstring states, and no process is left once nsadiag exits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from nsadiag.finding.numbers import sig
from nsadiag.verdict.thresholds import (
    COMPILE_BOUND_SHARE,
    DATA_BOUND_SHARE,
    DATA_LARGEST_SHARE,
    MIN_RECOMPILES,
    RECOMPUTE_SHARE,
)
from tests.helpers import REPO, SCRIPTS
from tests.procs import owned_by, wait_for, with_cmdline, with_environ

RUN_MARK = "TESTS_RUN_MARK"  # not NSADIAG_*: a script that strips those keeps it


def nsadiag_run(tmp_path: Path, options: list[str], command: list[str],
                timeout: float = 400) -> tuple[subprocess.CompletedProcess, dict, dict, float]:
    """Run `nsadiag run OPTIONS -- COMMAND`; (process, summary, record, exit time)."""
    mark = f"{os.getpid()}-{time.monotonic_ns()}"  # inherited by all the command starts
    proc = subprocess.Popen([sys.executable, "-m", "nsadiag.cli", "run", *options, "--out",
                             str(tmp_path / "run"), "--", *command], cwd=REPO,
                            env={**os.environ, RUN_MARK: mark},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=timeout)
    exited = time.time()
    assert owned_by(proc.pid) == [], "a process of the command outlived nsadiag"
    # nsadiag's reaper ends a moment after nsadiag; anything of the command must be gone
    wait_for(lambda: not with_environ(RUN_MARK, mark), 15,
             lambda: "every process of the command to end: outlived nsadiag: "
                     f"{[p.cmdline() for p in with_environ(RUN_MARK, mark)]}", every_s=0.2)
    run = tmp_path / "run"
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return (done, json.loads((run / "summary.json").read_text()),
            json.loads((run / "record.json").read_text()), exited)


def test_per_token_loop_is_slow_at_the_deadline(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--deadline", "15", "--stall-timeout", "30"],
        [sys.executable, str(SCRIPTS / "slow_token_loop.py")])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "SLOW", summary["headline"]
    reasons = " ".join(record["verdict"]["reasons"])
    assert "still progressing" in reasons
    assert "loop variable `t` in forward (slow_token_loop.py:" in reasons
    assert record["verdict"]["facts"]["steps_done"] >= 1
    # a user's run has no step count: no ETA for the run, so the advice names none
    assert "ETA unknown" in reasons or "ETA of the whole run unknown" in reasons
    assert "eta_s" not in record["verdict"]["facts"]  # a fact not known is not recorded
    advice = (tmp_path / "run" / "report.md").read_text().split("## Recommendations")[1]
    assert "than the ETA" not in advice and "above the ETA" not in advice


TINY_BLOCKS_SLOW_METRIC = """
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(16))  # cheap blocks

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


model = Model()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100):
    x = model(torch.randn(1, 262144, 8))
    with torch.no_grad():  # a metric for the log, one position at a time
        worst = [max(x[:, t, i].abs().max().item() for i in range(8))
                 for t in range(x.shape[1])]
    loss = x.pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} worst {max(worst):.3f}", flush=True)
"""


def test_a_burst_of_module_events_before_a_long_silence_gives_no_rate_over_no_time(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TINY_BLOCKS_SLOW_METRIC)
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--deadline", "12", "--stall-timeout", "30"], [sys.executable, str(script)])
    assert summary["verdict"] == "SLOW", summary["headline"]
    facts = record["verdict"]["facts"]
    # 32 module events within milliseconds, then many seconds of the metric loop: the pace
    # runs to the kill, never over the burst's 0.0 s
    assert facts["rate_window_s"] >= 1.0 or facts.get("rate") is None, facts
    assert not any("over the last 0.0 s" in r for r in record["verdict"]["reasons"])


def test_lock_taken_in_a_gradient_hook_is_a_deadlock_naming_the_line(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--stall-timeout", "5"],
        [sys.executable, str(SCRIPTS / "grad_hook_deadlock.py")])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "DEADLOCK", summary["headline"]
    facts = record["verdict"]["facts"]
    assert facts["wait_frame"].startswith("record_norm (grad_hook_deadlock.py:")
    assert "with stats_lock:" in " ".join(record["verdict"]["reasons"])
    chain = facts["wait_chain"]
    assert chain["end"] == "lock-self"
    assert "`stats_lock` is held by the same thread" in chain["printed"]
    assert summary["finding"]["next_action"].startswith(
        "Do not take the lock `stats_lock` again while the same thread holds it")


def test_extra_all_reduce_on_one_rank_is_stall_collective_naming_it(tmp_path):
    stall_timeout = 10.0
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(SCRIPTS / "ddp_extra_allreduce.py")]
    done, summary, record, _ = nsadiag_run(
        tmp_path / "first", ["--stall-timeout", str(stall_timeout)], command)
    if record["evidence"]["outcome"]["kill_reason"] != "stall":
        # gloo ended rank 0's collective ("remote worker crashing") before the stall clock
        # fired, a race of the scenario seen once on a loaded machine: run it once more
        done, summary, record, _ = nsadiag_run(
            tmp_path / "again", ["--stall-timeout", str(stall_timeout)], command)
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "STALL-COLLECTIVE", summary["headline"]
    facts = record["verdict"]["facts"]
    assert facts["odd_ranks"] == [1]
    rows = {row["rank"]: row for row in facts["ranks"]}
    line = _line("ddp_extra_allreduce.py", "dist.all_reduce(overflow,")
    assert rows[1]["waiting"].endswith(f"from main (ddp_extra_allreduce.py:{line}))")
    assert rows[0]["waiting"].startswith("all_reduce #3 (DDP bucket 0")
    assert summary["failing"]["reasons"][0].startswith("rank 1 waits in all_reduce #3")
    # the line blamed is the collective only rank 1 issues
    assert summary["finding"]["culprit"]["where"] == f"ddp_extra_allreduce.py:{line}"
    # the verdict came from nsadiag's stall clock while both ranks still waited, not from the
    # collective giving up: the ranks were stopped at the stall, no rank timed out
    assert record["evidence"]["outcome"]["kill_reason"] == "stall"
    assert facts["pg_timeout"] is False
    # an extra collective inside the loop both ranks are in is not uneven data
    assert facts["wait_chain"]["end"] == "collective-differs"
    assert "same number of steps" not in summary["finding"]["next_action"]
    assert all(rank["stall"] and rank["stall"]["samples"] for rank in record["evidence"]["ranks"])


def test_helpers_in_new_sessions_are_gone_after_an_ok_verdict(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, [], [sys.executable, str(SCRIPTS / "new_session_helper.py")])
    assert done.returncode == 0, done.stderr
    assert summary["verdict"] == "OK", summary["headline"]
    assert record["verdict"]["reasons"][0].startswith("the command finished 3 of 3 steps")
    helpers = [p for p in json.loads((tmp_path / "run" / "evidence.json").read_text())
               ["processes"] if p["events"].get("start")]
    assert len(helpers) >= 3, "the script and both helpers were watched"
    assert with_cmdline("nsadiag repro: log shipper") == []
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["command_name"] == "run" and meta["argv"][-1].endswith("new_session_helper.py")


def _line(script: str, starts: str, exact: bool = False) -> int:
    """The number of the first line of repro/scripts/`script` that is `starts` or, unless
    `exact`, starts with it followed by a space (a call, a comment)."""
    return next(i for i, text in enumerate((SCRIPTS / script).read_text().splitlines(), 1)
                if text.strip() == starts or not exact and (
                    text.strip().startswith(starts + " ") or
                    (starts.endswith("(") and text.strip().startswith(starts))))


def test_a_dataloader_worker_that_waits_is_named_with_its_frame(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--stall-timeout", "5"],
        [sys.executable, str(SCRIPTS / "dataloader_worker_hang.py")])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "DEADLOCK", summary["headline"]
    facts = record["verdict"]["facts"]
    line = _line("dataloader_worker_hang.py", "with self.lock:", exact=True)  # __getitem__'s
    chain = facts["wait_chain"]
    assert chain["end"] == "lock-lost-fork"
    worker = next(o for o in facts["others"]
                  if o["role"] == "DataLoader worker 0 of the main process")
    assert worker["place"]["where"] == \
        f"TokenDataset.__getitem__ (dataloader_worker_hang.py:{line})"
    assert (f"-> DataLoader worker 0 of the main process (pid {worker['pid']}) waits for "
            f"`self.lock` at dataloader_worker_hang.py:{line} -> `self.lock` is held by no "
            f"thread of DataLoader worker 0 of the main process: it was locked when the "
            f"process was forked") in chain["printed"]
    # the chain names the worker that holds the run up: no second sentence guesses one
    assert "held_by" not in facts
    assert summary["finding"]["next_action"].startswith(
        "Do not fork while a thread holds `self.lock`")
    assert sorted(other["role"] for other in facts["others"]) == [
        "DataLoader worker 0 of the main process", "DataLoader worker 1 of the main process"]
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"| DataLoader worker 1 of the main process | - | waiting | waits in " \
           f"TokenDataset.__getitem__ (dataloader_worker_hang.py:{line})" in report
    assert "(stopped by nsadiag at a stall)" in report and "exit code None" not in report


def test_a_rank_aborted_by_a_collective_mismatch_is_explained_by_what_it_left(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--stall-timeout", "10"],
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(SCRIPTS / "ddp_collective_mismatch.py")])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "CRASH", summary["headline"]
    facts, reasons = record["verdict"]["facts"], record["verdict"]["reasons"]
    assert facts["rank"] == 1 and facts["signal_name"] == "SIGABRT"
    line = _line("ddp_collective_mismatch.py", "dist.all_reduce(total)")
    assert reasons[0].startswith("rank 1 died of SIGABRT (its faulthandler dump: \"Fatal "
                                 "Python error: Aborted\") while its main thread was in "
                                 "all_reduce (distributed_c10d.py:")
    assert reasons[0].endswith(f"called from debug_stat (ddp_collective_mismatch.py:{line}); "
                               f"the runner did not kill it")
    assert any("Received data size doesn't match expected size" in r for r in reasons)
    n = facts["diverged_at"]
    mismatch = next(r for r in reasons if " met " in r)
    assert mismatch.startswith(f"rank 1's all_reduce #{n} (4 bytes) from debug_stat "
                               f"(ddp_collective_mismatch.py:{line}) met rank 0's DDP gradient "
                               f"all_reduce #{n} (37,408 bytes, bucket 0)")
    assert "killed by a signal or the OOM killer" not in " ".join(reasons)
    finding = summary["finding"]
    assert finding["proof"].startswith(f"rank 1 killed by SIGABRT (signal 6) in a job that ran "
                                       f"{sig(record['wall_s'])} s, without a Python exception")
    assert "signal None" not in finding["proof"] and "after 0 s" not in finding["proof"]
    assert finding["proof"].endswith(f"the ranks' collectives diverged at #{n} (their sizes and "
                                     f"kinds differ)")
    assert finding["culprit"]["where"] == f"ddp_collective_mismatch.py:{line}"
    assert finding["next_action"].startswith("Make every rank issue the same collectives in "
                                             "the same order")
    assert "gdb" not in finding["next_action"]
    roles = {p["role"] for p in json.loads((tmp_path / "run" / "evidence.json").read_text())
             ["processes"]}
    assert "the torchrun launcher" in roles and "a watched process" not in roles


def test_a_thread_that_dies_is_quoted_in_the_deadlock_it_leaves(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--stall-timeout", "5"],
        [sys.executable, str(SCRIPTS / "producer_thread_dies.py")])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "DEADLOCK", summary["headline"]
    reasons = record["verdict"]["reasons"]
    get = _line("producer_thread_dies.py", "batch = batches.get()")
    chain = record["verdict"]["facts"]["wait_chain"]
    assert chain["end"] == "producer-died"
    assert chain["printed"].startswith(
        f"the main thread waits for an item from `batches` at producer_thread_dies.py:{get} "
        f"-> thread producer died of ValueError: invalid literal for int() with base 10: "
        f"'corrupt' at ")
    assert reasons[2] == f"wait chain: {chain['printed']}"
    assert reasons[1].startswith("an exception ended another thread: thread producer died of "
                                 "ValueError: invalid literal for int() with base 10: "
                                 "'corrupt' at ")
    assert summary["finding"]["next_action"].startswith(
        "Fix the exception that ended the thread feeding `batches`")
    assert f"called from main (producer_thread_dies.py:{get})" in reasons[-1]
    # the main thread sat in get() without the CPU: that line is a wait, never "hottest"
    assert not any(r.startswith("hottest line of user code: main (producer_thread_dies.py:"
                                f"{get})") for r in reasons)
    # where the samples fell most, when that is a wait: the get() line (on a loaded machine
    # the import can outweigh the short wait before the stall, and then no line is named)
    most = [r for r in reasons if r.startswith("most samples")]
    assert all(f"producer_thread_dies.py:{get})" in r for r in most), most


def test_a_loop_that_keeps_each_steps_graph_dies_of_memory_naming_the_line(tmp_path):
    script = SCRIPTS / "loss_history_leak.py"
    done, summary, record, _ = nsadiag_run(
        tmp_path, [], ["bash", "-c", f"ulimit -v 2000000; exec {sys.executable} {script}"])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "OOM", summary["headline"]
    facts = record["verdict"]["facts"]
    assert facts["rss_growth_per_step"] > 16 * 2**20  # 1024 x 512 activations x 5 tensors
    line = _line("loss_history_leak.py", "val_losses.append(")
    assert facts["rss_holder"] == f"main (loss_history_leak.py:{line})"
    # blamed on what keeps it: the container the loop appends each step's tensor to
    culprit = summary["finding"]["culprit"]
    assert culprit["where"] == f"loss_history_leak.py:{line}"
    assert culprit["retains"] == "val_losses"
    assert summary["finding"]["next_action"].startswith(
        f"Keep the value, not the tensor, in `val_losses` at loss_history_leak.py:{line}: "
        f"append `.item()`")
    assert "checkpointing" not in summary["finding"]["next_action"]


def _slow_with_cause(tmp_path, script: str, deadline: int, kind: str
                     ) -> tuple[dict, dict, dict]:
    """Run repro/scripts/`script` to its deadline: SLOW of cause class `kind`, with one
    next step (the finding's) and that class's cause line first among the implicated;
    (summary, facts, its cause)."""
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--deadline", str(deadline), "--stall-timeout", "60"],
        [sys.executable, str(SCRIPTS / script)])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "SLOW", summary["headline"]
    facts = record["verdict"]["facts"]
    cause = facts.get("slow_cause") or {}
    assert cause.get("kind") == kind, (summary["headline"], record["verdict"]["reasons"])
    assert summary["headline"].startswith(f"SLOW (slow, work not counted: {kind}) at ")
    assert f"cause: {cause['sentence']}" in record["verdict"]["reasons"]
    assert "next_step" not in facts and "next_step" not in summary["failing"]["facts"]
    said = summary["finding"]["next_action"]
    assert "per-token" not in said and "tensor ops" not in said and ".item()" not in said
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"- **Next:** {said}" in report and f"Cause: {cause['sentence']}." in report
    return summary, facts, cause


def test_a_run_waiting_on_slow_storage_is_data_bound_naming_its_workers(tmp_path):
    summary, facts, cause = _slow_with_cause(tmp_path, "slow_storage_loader.py", 15,
                                             "data-bound")
    # on a loaded machine the model's steps slow and the share may fall under half: then
    # it must still outweigh every other phase (DATA_LARGEST_SHARE)
    assert cause["waited"] and (cause["share"] >= DATA_BOUND_SHARE or (
        cause["share"] >= DATA_LARGEST_SHARE and
        cause["samples"] > cause["largest_other"]["samples"]))
    loop = _line("slow_storage_loader.py", "for inputs, targets in loader:", exact=True)
    assert cause["asked_at"] == f"main (slow_storage_loader.py:{loop})"
    read = _line("slow_storage_loader.py", "time.sleep(READ_LATENCY_S)")
    assert [w["worker"] for w in cause["workers"]] == [0, 1]
    # where each worker stood most in the samples taken at the kill: the read's sleep, or
    # on a loaded machine the record's decoding just after it (two samples a worker)
    body = {f"slow_storage_loader.py:{n}" for n in range(read, read + 3)}
    assert all(w["where"].startswith("read_record (") and w["where"][13:-1] in body
               for w in cause["workers"]), cause["workers"]
    assert summary["finding"]["culprit"]["where"] in body
    said = summary["finding"]["next_action"]
    assert said.startswith("Make the batches arrive faster: the main process waited for "
                           f"them in {cause['share']:.0%} of its samples")
    assert "storage" in said and "`num_workers` above 2" in said and "prefetch_factor" in said


def test_a_compiled_model_given_a_new_length_each_step_is_slow_by_recompiles(tmp_path):
    summary, facts, cause = _slow_with_cause(tmp_path, "compiled_variable_lengths.py", 40,
                                             "recompiles")
    assert cause["recompiles"] >= MIN_RECOMPILES and cause["function"] == "forward"
    assert cause["guard"].startswith("tensor 'ids' size mismatch at index 1. expected ")
    assert cause["size_dim"] == 1 and cause["share"] >= COMPILE_BOUND_SHARE
    call = _line("compiled_variable_lengths.py", "logits = compiled(inputs)", exact=True)
    assert summary["finding"]["culprit"]["where"] == f"compiled_variable_lengths.py:{call}"
    said = summary["finding"]["next_action"]
    assert f"`{cause['guard']}`" in said and "`dynamic=True`" in said and "pad" in said
    # the compiler's output and its wrappers are never the user's code
    assert "compiled_variable_lengths.py" in facts["hot_frame"]
    named = [facts["hot_frame"], summary["finding"]["culprit"]["where"], cause["sentence"]]
    assert not any(re.search(r"torchinductor|eval_with_key|\.triton|_dynamo|_inductor", line)
                   for line in named), named


def test_a_backward_spent_recomputing_checkpoints_is_named_as_such(tmp_path):
    summary, facts, cause = _slow_with_cause(tmp_path, "checkpoint_recompute.py", 15,
                                             "checkpoint-recompute")
    assert cause["backward_share"] >= RECOMPUTE_SHARE
    call = _line("checkpoint_recompute.py", "x = checkpoint(block, x, use_reentrant=False)")
    assert cause["called_at"] == f"forward (checkpoint_recompute.py:{call})"
    block = range(_line("checkpoint_recompute.py", "def forward(self, x: torch.Tensor) -> "
                                                   "torch.Tensor:"),
                  _line("checkpoint_recompute.py", "return x + self.proj(routed)") + 1)
    assert int(cause["inner"].rsplit(":", 1)[1].rstrip(")")) in block, cause["inner"]
    assert summary["finding"]["culprit"]["where"] == f"checkpoint_recompute.py:{call}"
    said = summary["finding"]["next_action"]
    assert said.startswith(f"Checkpoint less: the backward spent "
                           f"{cause['backward_share']:.0%} of its samples rerunning")
