"""Strangers' stuck scripts (repro/scripts/) through `nsadiag run`: the report's top block
names the wait chain each script's docstring states, and the Next line follows from the
chain's end."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from nsadiag.redact import redact
from tests.helpers import SCRIPTS
from tests.pty_cli import in_pty, screen
from tests.zoo.test_run_scripts import _line, nsadiag_run


def _top(tmp_path) -> list[str]:
    report = (tmp_path / "run" / "report.md").read_text().split("\n## ")[0]
    return report.splitlines()


def _run(tmp_path, script: str) -> tuple[dict, dict, list[str]]:
    done, summary, record, _ = nsadiag_run(tmp_path, ["--stall-timeout", "4"],
                                           [sys.executable, str(SCRIPTS / script)])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "DEADLOCK", summary["headline"]
    return summary, record["verdict"]["facts"]["wait_chain"], _top(tmp_path)


def test_two_locks_taken_in_opposite_order_show_both_threads_in_the_top_block(tmp_path):
    summary, chain, top = _run(tmp_path, "two_locks_opposite_order.py")
    script = "two_locks_opposite_order.py"
    inner = _line(script, "with stats_lock:", exact=True)  # the logger's, taken first
    main_wait = max(i for i, text in enumerate((SCRIPTS / script).read_text().splitlines(), 1)
                    if text.strip() == "with stats_lock:")
    logger_wait = _line(script, "with model_lock:", exact=True)
    main_holds = max(i for i, text in enumerate((SCRIPTS / script).read_text().splitlines(), 1)
                     if text.strip() == "with model_lock:")
    assert chain["end"] == "lock-cycle"
    assert chain["printed"] == (
        f"the main thread waits for `stats_lock` at {script}:{main_wait} -> `stats_lock` is "
        f"held by thread logger (inside `with stats_lock:` at {script}:{inner}) -> thread "
        f"logger waits for `model_lock` at {script}:{logger_wait}, which the main thread holds "
        f"(inside `with model_lock:` at {script}:{main_holds}): each waits for the other")
    assert f"- **Waits:** {chain['printed']}" in top
    assert summary["finding"]["next_action"].startswith(
        "Take the locks `stats_lock` and `model_lock` in the same order in every thread")


@pytest.mark.parametrize(("script", "end", "says", "next_starts"), [
    ("lock_across_queue_put.py", "queue-full", "thread loader waits in `batches.put` at ",
     "Do not hold the lock `state_lock` across a blocking `put`"),
    ("child_never_exits.py", "pipe-eof", "(`sort -u`) to exit at child_never_exits.py:",
     "Close the write end before waiting for `sort -u`"),
    ("file_lock_sibling.py", "file-lock", "`may_write.wait()",
     "The process holding the file lock on /"),
    ("reward_server_reads_to_eof.py", "socket-peer", "waits to read the same connection at "
     "reward_server_reads_to_eof.py:", "Make `python reward_server_reads_to_eof.py serve "),
    ("poll_for_file.py", "poll", "polls `not os.path.exists(marker)` in a sleep loop at "
     "poll_for_file.py:", "Add a timeout to the polling loop at poll_for_file.py:"),
    ("server_keeps_output_open.py", "pipe-held", "ended (exited with code 0) -> but the "
     "write end of its output (pipe:[", "`python -c import time; time.sleep(3600)` holds "
     "the write end of the pipe read at server_keeps_output_open.py:"),
    ("pool_worker_killed.py", "pool-worker-ended", "ended (killed by SIGKILL) while it ran "
     "the task; the pool replaced it with pid ", "Find why pool worker pid "),
    ("fork_while_logging.py", "lock-lost-fork", "(forked from this process, no exec), the "
     "main thread waits for `METRICS_LOCK` at fork_while_logging.py:42",
     "Do not fork while another thread may hold `METRICS_LOCK`: start the child with the "
     "spawn start method"),
    ("shard_barrier_party_died.py", "barrier-party-died", "thread loader-2 died of "
     "FileNotFoundError: ", "Fix the exception that ended the thread the chain names at "
     "shard_barrier_party_died.py:"),
    pytest.param("eval_in_forked_child.py", "fork-thread-pool", "(forked from this process, "
                 "no exec), the main thread waits inside torch's Linear.forward",
                 "Start the child with the spawn start method",
                 marks=pytest.mark.skipif((os.cpu_count() or 1) < 2, reason=(
                     "torch's intra-op pool has one thread on one CPU: the fork copies it"))),
    ("rendezvous_missing_rank.py", "rendezvous-missing", "waits in torch.distributed's "
     "`init_process_group` at rendezvous_missing_rank.py:", "Start every rank that "
     "`init_process_group` waits for"),
    ("writer_thread_never_told_to_stop.py", "no-producer", "waits for thread `writer` to "
     "finish at writer_thread_never_told_to_stop.py:", "Make sure a thread feeds `records` "),
])
def test_each_stuck_script_names_its_chain_and_a_next_step_from_its_end(tmp_path, script, end,
                                                                          says, next_starts):
    summary, chain, top = _run(tmp_path, script)
    assert chain["end"] == end, chain["printed"]
    assert says in chain["printed"]
    assert f"- **Waits:** {redact(chain['printed'])}" in top  # addresses hidden there
    assert summary["finding"]["next_action"].startswith(next_starts), \
        summary["finding"]["next_action"]
    assert "lock" not in summary["finding"]["next_action"] or end in ("queue-full",
                                                                      "file-lock",
                                                                      "lock-lost-fork")
    if end == "file-lock":  # a wait in the kernel: the line is the chain's first hop
        assert summary["finding"]["culprit"]["where"] == chain["hops"][0]["where"]


def test_a_host_read_loop_in_the_loss_is_named_with_per_iteration_advice(tmp_path):
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--deadline", "15", "--stall-timeout", "30"],
        [sys.executable, str(SCRIPTS / "loss_token_loop.py")])
    assert summary["verdict"] == "SLOW", (summary["headline"], record["verdict"]["reasons"])
    loop = _line("loss_token_loop.py", "for count in range(targets.shape[0]):", exact=True)
    culprit = summary["finding"]["culprit"]
    # the inner loop of the loss function, not the outer step loop
    assert culprit["line"] == loop and culprit["host_read"].startswith(f"{loop + 1} `token = ")
    assert summary["finding"]["next_action"].startswith(
        f"Replace the loop at loss_token_loop.py:{loop}-")
    assert f"(line {loop + 1} `token = " in summary["finding"]["next_action"]


def test_a_compile_waiting_for_its_cxx_compiler_names_the_compiler_and_says_run_it(tmp_path):
    # the site's CXX is a compiler wrapper that never answers; a fresh inductor cache, so
    # no earlier build lets the compile skip the compiler
    script, wrapper = SCRIPTS / "compiled_model_cpu.py", SCRIPTS / "cxx_wrapper_waits.sh"
    done, summary, record, _ = nsadiag_run(
        tmp_path, ["--stall-timeout", "6"],
        ["bash", "-c", f"CXX={wrapper} TORCHINDUCTOR_CACHE_DIR={tmp_path / 'inductor'} "
                       f"exec {sys.executable} {script}"])
    assert done.returncode == 1, done.stderr
    assert summary["verdict"] == "DEADLOCK", summary["headline"]
    chain = record["verdict"]["facts"]["wait_chain"]
    call = _line("compiled_model_cpu.py", "loss = (compiled(x) - x).pow(2).mean()", exact=True)
    assert chain["end"] == "compile-cxx", chain["printed"]
    assert chain["printed"].startswith("the main thread waits to read the output of child pid ")
    assert "cxx_wrapper_waits.sh" in chain["subject"]
    assert " inside torch.compile (" in chain["printed"] and "cpp_builder.py:" in \
        chain["printed"]
    assert f" at compiled_model_cpu.py:{call} -> pid " in chain["printed"]
    assert f"- **Waits:** {redact(chain['printed'])}" in _top(tmp_path)
    said = summary["finding"]["next_action"]
    assert said.startswith(f"torch.compile (called at compiled_model_cpu.py:{call}) waits "
                           f"for `"), said
    assert "cxx_wrapper_waits.sh" in said and "`CXX`" in said and "lock" not in said


@pytest.mark.parametrize(("script", "question", "after"), [
    ("prompt_before_overwrite.py", "exists; overwrite it? [y/N]", "keeping the old checkpoint"),
    ("prompt_in_worker_thread.py", "exists; rebuild it? [y/N]", "trained on the cached tokens")],
    ids=["main-thread", "thread-the-main-thread-joins"])
def test_a_prompt_in_a_terminal_holds_the_stall_clock_until_it_is_answered(tmp_path, script,
                                                                         question, after):
    # the script asks before it overwrites a checkpoint (in its main thread, or in a thread
    # the main thread joins); the answer comes well after the stall timeout: waiting for a
    # person is not a stall, and the run goes on once answered
    out, stall_timeout_s, answer_after_s = tmp_path / "run", 4, 12
    asked_at: list[float] = []

    def answer(shown: str) -> bytes | None:
        if question not in shown:
            return None
        if not asked_at:
            asked_at.append(time.monotonic())
        if time.monotonic() - asked_at[0] < answer_after_s or len(asked_at) > 1:
            return None
        asked_at.append(time.monotonic())
        return b"n\n"

    done = in_pty([sys.executable, "-m", "nsadiag.cli", "run", "--stall-timeout",
                   str(stall_timeout_s), "--out", str(out), "--", sys.executable,
                   str(SCRIPTS / script)], 300, cwd=tmp_path, answer=answer)
    assert done.ended and len(asked_at) == 2, done.output[-2000:]
    assert done.returncode == 0, done.output[-2000:]
    if script == "prompt_before_overwrite.py":  # the live line reads the main thread only
        assert "waiting for an answer typed at the terminal" in done.output
    assert after in screen(done.output)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "OK", summary["headline"]
