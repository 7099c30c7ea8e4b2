"""Verdicts on a quiet and on a loaded machine: the fault zoo and the plain scripts.

    python bench/bench_verdicts.py [--only NAME ...] [--conditions quiet,loaded]
                                   [--out reports/verdicts-under-load.md] [--json PATH]
                                   [--from-json PATH ...] [--pty] [--causes-out PATH]

Diagnoses every fault-zoo entry (repro.ZOO, as `nsadiag env --self-test` does) and runs
every script of repro/scripts/ under `nsadiag run` with the options and the environment its
docstring gives (cxx_wrapper_waits.sh is no entry of its own: it is the compiler that
compiled_model_cpu.py's run names in `CXX`); a script that asks a question at the terminal
gets its answer typed once the question has waited past the stall timeout. First without
added load ("quiet": whatever else the machine runs), then with two
`python -c 'while True: pass'` burners (started here and killed at the end). Prints one
row per entry: the expected verdict and, per condition, the verdict got and the time to
it (a zoo entry's trial or check; a script's whole `nsadiag run`, start-up included).
With --out, writes the table and the load averages into that Markdown file, above its
"## What the progress sampler costs" section, which is kept. --json keeps the results;
--from-json writes the table from results kept by earlier runs (parts of the entries, in
the order given, each part's condition measured in one go) instead of measuring.

Every row also says whether the cause its finding printed (cause_of: the wait chain's
end, the slow class, what retains memory, ...) is the one the entry's docstring states
(CAUSES) and keeps the chain and Next as printed; --causes-out writes that table, with the
p50 and p90 time to verdict per condition over every entry, as its own section of a
Markdown file; --pty runs each `nsadiag run` in a pseudo-terminal, as a person at a
terminal would.

--heldout runs the held-out scripts of repro/heldout/ instead: scripts written by someone
who had not read nsadiag, each docstring stating its expected verdict, how it is run, the
words a right cause names and the words a right Next gives (``HeldOut``). A run's cause is
right when one of its cause words is in the top block's Line, Waits or Proof, its Next
right when one of its Next words is in the Next; --out then writes their table as the
HELDOUT_SECTION of that file, apart from the developed-on table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "repro" / "scripts"
KEPT_FROM = "## What the progress sampler costs"

# script -> (expected verdict, nsadiag run options, the command after --, as its docstring)
SCRIPT_RUNS: dict[str, tuple[str, list[str], list[str]]] = {
    "slow_token_loop.py": ("SLOW", ["--deadline", "20"], ["python", "{script}"]),
    "grad_hook_deadlock.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "ddp_extra_allreduce.py": ("STALL-COLLECTIVE", ["--stall-timeout", "10"],
                               ["torchrun", "{script}"]),
    "new_session_helper.py": ("OK", [], ["python", "{script}"]),
    "dataloader_worker_hang.py": ("DEADLOCK", ["--stall-timeout", "5"],
                                  ["python", "{script}"]),
    "ddp_collective_mismatch.py": ("CRASH", ["--stall-timeout", "10"],
                                   ["torchrun", "{script}"]),
    "producer_thread_dies.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "loss_history_leak.py": ("OOM", [], ["ulimit", "{script}"]),
    "two_locks_opposite_order.py": ("DEADLOCK", ["--stall-timeout", "5"],
                                    ["python", "{script}"]),
    "lock_across_queue_put.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "child_never_exits.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "file_lock_sibling.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "poll_for_file.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "ddp_uneven_data.py": ("STALL-COLLECTIVE", ["--stall-timeout", "10"],
                           ["torchrun", "{script}"]),
    "ddp_rank_polls_file.py": ("STALL-COLLECTIVE", ["--stall-timeout", "10"],
                               ["torchrun", "{script}"]),
    "loss_token_loop.py": ("SLOW", ["--deadline", "15", "--stall-timeout", "30"],
                           ["python", "{script}"]),
    "val_history_graph.py": ("OOM", [], ["ulimit", "{script}"]),
    "checkpoint_recompute.py": ("SLOW", ["--deadline", "20"], ["python", "{script}"]),
    "compiled_model_cpu.py": ("DEADLOCK", [], ["python", "{script}"]),
    "compiled_variable_lengths.py": ("SLOW", ["--deadline", "40"], ["python", "{script}"]),
    "pool_worker_killed.py": ("DEADLOCK", [], ["python", "{script}"]),
    "prompt_before_overwrite.py": ("OK", [], ["python", "{script}"]),
    "prompt_in_worker_thread.py": ("OK", [], ["python", "{script}"]),
    "reward_server_reads_to_eof.py": ("DEADLOCK", ["--stall-timeout", "5"],
                                      ["python", "{script}"]),
    "server_keeps_output_open.py": ("DEADLOCK", [], ["python", "{script}"]),
    "slow_storage_loader.py": ("SLOW", ["--deadline", "20"], ["python", "{script}"]),
    "writer_thread_never_told_to_stop.py": ("DEADLOCK", [], ["python", "{script}"]),
    "fork_while_logging.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "result_queue_joined_first.py": ("DEADLOCK", ["--stall-timeout", "5"],
                                     ["python", "{script}"]),
    "regex_backtracks.py": ("STALL-BUSY", ["--stall-timeout", "5"], ["python", "{script}"]),
    "normalize_per_item.py": ("SLOW", ["--deadline", "20"], ["python", "{script}"]),
    "shard_barrier_party_died.py": ("DEADLOCK", ["--stall-timeout", "5"],
                                    ["python", "{script}"]),
    "eval_in_forked_child.py": ("DEADLOCK", ["--stall-timeout", "5"], ["python", "{script}"]),
    "rendezvous_missing_rank.py": ("DEADLOCK", ["--stall-timeout", "5"],
                                   ["python", "{script}"]),
}
SCRIPT_ENV: dict[str, dict[str, str]] = {
    # the site's CXX, a compiler wrapper that never answers (cxx_wrapper_waits.sh stands for
    # it); a fresh inductor cache (in the run's directory), so that no earlier build of the
    # same graph lets the compile skip the compiler
    "compiled_model_cpu.py": {"CXX": str(SCRIPTS / "cxx_wrapper_waits.sh"),
                              "TORCHINDUCTOR_CACHE_DIR": "{out}/inductor"},
}
"""Environment a script's docstring runs it with, beside the bench's own ({out}: the run's
directory)."""
PROMPTS: dict[str, tuple[str, str]] = {
    "prompt_before_overwrite.py": ("exists; overwrite it? [y/N]", "n\n"),
    "prompt_in_worker_thread.py": ("exists; rebuild it? [y/N]", "n\n"),
}
"""Scripts that ask a question at the terminal: the question, and what a person types once
ANSWER_AFTER_S past the run's stall timeout has gone by since it was shown (so a stall
called while the question waits would be seen)."""
ANSWER_AFTER_S = 10.0
CAUSES: dict[str, str] = {
    # the fault zoo: what each entry's docstring states
    "per_token_loop": "per-token host reads", "long_token_loop": "per-token host reads",
    "sequential_prefill": "per-token host reads", "lock_deadlock": "lock-lost",
    "native_stall": "busy-native", "python_spin": "busy-python",
    "backward_error": "raises RuntimeError", "hard_crash": "signal SIGSEGV",
    "dense_masks": "peak memory", "late_bound_ckpt": "ckpt check",
    # the scripts of repro/scripts/
    "slow_token_loop.py": "per-token host reads", "grad_hook_deadlock.py": "lock-self",
    "ddp_extra_allreduce.py": "collective-differs", "new_session_helper.py": "none",
    "dataloader_worker_hang.py": "lock-lost-fork",
    "ddp_collective_mismatch.py": "collective mismatch",
    "producer_thread_dies.py": "producer-died", "loss_history_leak.py": "retains val_losses",
    "two_locks_opposite_order.py": "lock-cycle", "lock_across_queue_put.py": "queue-full",
    "child_never_exits.py": "pipe-eof", "file_lock_sibling.py": "file-lock",
    "poll_for_file.py": "poll", "ddp_uneven_data.py": "uneven-steps",
    "ddp_rank_polls_file.py": "poll", "loss_token_loop.py": "per-token host reads",
    "val_history_graph.py": "retains history",
    "checkpoint_recompute.py": "checkpoint-recompute", "compiled_model_cpu.py": "compile-cxx",
    "compiled_variable_lengths.py": "recompiles", "pool_worker_killed.py": "pool-worker-ended",
    "prompt_before_overwrite.py": "none", "prompt_in_worker_thread.py": "none",
    "reward_server_reads_to_eof.py": "socket-peer", "server_keeps_output_open.py": "pipe-held",
    "slow_storage_loader.py": "data-bound", "writer_thread_never_told_to_stop.py": "no-producer",
    "fork_while_logging.py": "lock-lost-fork", "result_queue_joined_first.py": "pipe-unread",
    "regex_backtracks.py": "busy-native", "normalize_per_item.py": "data-bound",
    "shard_barrier_party_died.py": "barrier-party-died",
    "eval_in_forked_child.py": "fork-thread-pool",
    "rendezvous_missing_rank.py": "rendezvous-missing",
}
"""Each entry's true cause, as its docstring states it, in the words cause_of prints: a
stuck run's wait-chain end (nsadiag.verdict.chain.ENDS), the slow class (per-token host
reads), the container that retains a growing memory (else a peak), a collective mismatch
or the signal a process died of, the exception raised, how a busy stall's stacks read
(nsadiag.probes.frames.classify), the correctness check that failed."""


def cause_of(verdict: str, finding: dict[str, Any], facts: dict[str, Any]) -> str:
    """The cause a run's finding printed (its top block: chain, culprit, verdict facts), in
    CAUSES' words; "none" when it names none."""
    culprit = finding.get("culprit") or {}
    if facts.get("wait_chain"):
        return facts["wait_chain"]["end"]
    if verdict == "SLOW":
        if culprit.get("host_read") or facts.get("slow_by") == "defect":
            return "per-token host reads"
        if facts.get("slow_cause"):  # data-bound, recompiles, checkpoint-recompute
            return str(facts["slow_cause"]["kind"])
        return f"slow by {facts['slow_by']}" if facts.get("slow_by") else "none"
    if verdict == "OOM":
        return f"retains {culprit['retains']}" if culprit.get("retains") else \
            "memory grows per step" if (facts.get("rss_growth_per_step") or 0) > 0 and \
            facts.get("rss_holder") else "peak memory"
    if verdict == "CRASH":
        return "collective mismatch" if facts.get("diverged_at") else \
            f"signal {facts['signal_name']}" if facts.get("signal_name") else "none"
    if verdict == "ERROR" and facts.get("exception_type"):
        return f"raises {facts['exception_type']}"
    if verdict == "STALL-BUSY" and facts.get("stacks_class"):
        return str(facts["stacks_class"])
    if verdict == "WRONG" and facts.get("check"):
        return f"{facts['check']} check"
    return "none"


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (p50: fraction 0.5)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def command(kind: str, script: Path) -> list[str]:
    """The command line of a script run: plain python, torchrun with two ranks, or python
    under a 2 GB address-space limit (`ulimit -v`, as a job scheduler sets one)."""
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", str(script)]
    if kind == "ulimit":
        return ["bash", "-c", f"ulimit -v 2000000; exec {sys.executable} {script}"]
    return [sys.executable, str(script)]


def _stall_timeout(options: list[str]) -> float:
    """The stall timeout a run's options give (nsadiag run's default without one)."""
    from nsadiag.spec import STALL_TIMEOUT_S

    if "--stall-timeout" in options:
        return float(options[options.index("--stall-timeout") + 1])
    return STALL_TIMEOUT_S


def _drive(argv: list[str], env: dict[str, str], prompt: tuple[str, str] | None,
           answer_after_s: float, timeout_s: float) -> tuple[int | None, str]:
    """Run ``argv`` with its stdin a pipe and its stdout and stderr read together; once
    ``prompt``'s question has been shown for ``answer_after_s``, type its answer (through
    `script`, the pty passes it on as typed at the terminal). The exit status (None: killed
    at ``timeout_s``) and the output."""
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdin is not None and process.stdout is not None
    chunks: list[bytes] = []
    asked_at: float | None = None
    answered = prompt is None
    end = time.monotonic() + timeout_s
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([process.stdout], [], [], 0.5)
            if ready:
                data = os.read(process.stdout.fileno(), 65536)
                if not data:
                    break
                chunks.append(data)
            if not answered and prompt is not None:
                shown = b"".join(chunks).decode(errors="replace")
                if asked_at is None and prompt[0] in shown:
                    asked_at = time.monotonic()
                if asked_at is not None and time.monotonic() - asked_at >= answer_after_s:
                    process.stdin.write(prompt[1].encode())
                    process.stdin.flush()
                    answered = True
        else:
            process.kill()
            process.wait()
            return None, b"".join(chunks).decode(errors="replace")
        return process.wait(timeout=max(1.0, end - time.monotonic())), \
            b"".join(chunks).decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdin.close()
        process.stdout.close()


def run_script(name: str, out: Path, pty: bool = False) -> dict[str, Any]:
    """One script under `nsadiag run` (in a pseudo-terminal, through `script`, with
    ``pty``), with the environment its docstring gives (SCRIPT_ENV) and, for a script that
    asks a question (PROMPTS), the answer typed ANSWER_AFTER_S past the stall timeout after
    it was shown: its verdict, the cause printed against CAUSES, the chain and Next as
    printed, and the seconds to the verdict."""
    expected, options, (kind, _) = SCRIPT_RUNS[name]
    argv = [sys.executable, "-m", "nsadiag.cli", "run", *options, "--out", str(out), "--",
            *command(kind, SCRIPTS / name)]
    if pty:
        argv = ["script", "-qfec", shlex.join(argv), "/dev/null"]
    env = {**os.environ, **{key: value.format(out=out)
                            for key, value in SCRIPT_ENV.get(name, {}).items()}}
    started = time.monotonic()
    returncode, output = _drive(argv, env, PROMPTS.get(name),
                                _stall_timeout(options) + ANSWER_AFTER_S, 900)
    seconds = time.monotonic() - started
    try:
        summary = json.loads((out / "summary.json").read_text())
        record = json.loads((out / "record.json").read_text())
        got, reason = summary["verdict"], summary["headline"]
    except (OSError, ValueError, KeyError):
        got, reason = f"exit {returncode}", output.strip()[-300:]
        summary, record = {}, {}
    finding = summary.get("finding") or {}
    cause = cause_of(got, finding, record.get("verdict", {}).get("facts") or {})
    return {"entry": name, "kind": "script", "expected": expected, "got": got,
            "match": got == expected, "reason": reason, "seconds": seconds,
            "cause": cause, "cause_expected": CAUSES[name],
            "cause_right": cause == CAUSES[name], "chain": finding.get("chain"),
            "next": (finding.get("next_action") or "").split(" Rerun: ")[0]}


def run_zoo(name: str) -> dict[str, Any]:
    """One zoo entry diagnosed as `nsadiag env --self-test` does, with the cause its
    finding prints (a trial's, or the check's for an entry diagnosed by a check)."""
    from nsadiag.checks import CheckResult
    from nsadiag.commands.selftest import self_test
    from nsadiag.finding.check import check_finding
    from nsadiag.finding.trial import trial_finding

    causes: dict[str, str] = {}
    printed: dict[str, Any] = {}

    def on_result(entry: str, result: Any) -> None:
        if isinstance(result, CheckResult):
            finding = check_finding([result], {}).to_dict()
            causes[entry] = cause_of(result.verdict.name, finding, {"check": result.name})
        else:
            finding = trial_finding(result, "self-test").to_dict()
            causes[entry] = cause_of(result.verdict_name, finding, result.verdict.facts.to_dict())
        printed.update(chain=finding.get("chain"), next=finding.get("next_action"))

    [row] = self_test(only=[name], on_result=on_result)
    cause = causes.get(name, "none")
    return {**row, "kind": "zoo", "cause": cause, "cause_expected": CAUSES[name],
            "cause_right": cause == CAUSES[name], **printed}


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def under_load(burners: int, run: Any) -> dict[str, Any]:
    """``run(tmp)`` (a temporary directory; it returns the condition's rows) with
    ``burners`` `python -c 'while True: pass'` processes running, started 5 s before so
    the load average sees them, and killed after: the rows with the load read around."""
    started = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
               for _ in range(burners)]
    try:
        if burners:
            time.sleep(5.0)  # let the load average see them
        load_start = loadavg()
        with tempfile.TemporaryDirectory(prefix="bench-verdicts-") as tmp:
            rows = run(Path(tmp))
        load_end = loadavg()
    finally:
        for process in started:
            process.kill()
            process.wait()
    return {"burners": burners, "load": [load_start, load_end], "rows": rows}


def one_condition(names: list[str], burners: int, pty: bool = False) -> dict[str, Any]:
    from repro import ZOO

    def run(tmp: Path) -> list[dict[str, Any]]:
        rows = []
        for name in names:
            row = run_zoo(name) if name in ZOO else run_script(name, tmp / name, pty)
            rows.append(row)
            print(f"{'loaded' if burners else 'quiet '} {row['entry']:<28} "
                  f"{row['expected']:<17} {row['got']:<17} {row['seconds']:6.1f} s",
                  flush=True)
        return rows
    return under_load(burners, run)


def merged(parts: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Results measured in parts, one condition's rows after another's, with the range of
    the load averages read at the parts' starts and ends, and the ends apart (a 1-minute
    average read as the burners start does not show them yet)."""
    conditions: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, found in part.items():
            into = conditions.setdefault(name, {"burners": found["burners"],
                                                "load": list(found["load"]), "rows": [],
                                                "ends": []})
            into["rows"] += found["rows"]
            into["ends"] += found.get("ends") or [found["load"][1]]
            readings = [*into["load"], *found["load"]]
            into["load"] = [min(readings), max(readings)]
    return conditions


def _load(found: dict[str, Any]) -> str:
    """The 1-minute load averages read at the end of a condition's runs (of each part)."""
    ends = found.get("ends") or [found["load"][1]]
    return f"{min(ends):.1f}-{max(ends):.1f}" if len(ends) > 1 else f"{ends[0]:.1f}"


def table(conditions: dict[str, dict[str, Any]]) -> list[str]:
    names = [row["entry"] for row in next(iter(conditions.values()))["rows"]]
    heads = {"quiet": "no added load", "loaded": "two burners"}
    header = "| entry | expected | " + " | ".join(
        f"{heads[c]} (load {_load(d)})" for c, d in conditions.items()) + " |"
    lines = [header, "|---|---|" + "---|" * len(conditions)]
    for index, name in enumerate(names):
        rows = [d["rows"][index] for d in conditions.values()]
        label = name if rows[0]["kind"] == "zoo" else f"scripts/{name}"
        cells = [f"{r['got']} ({r['seconds']:.1f} s)" + ("" if r["match"] else " **wrong**")
                 for r in rows]
        lines.append(f"| {label} | {rows[0]['expected']} | " + " | ".join(cells) + " |")
    return lines


def cause_table(conditions: dict[str, dict[str, Any]]) -> list[str]:
    """Per entry and condition: the verdict, whether the printed cause is the stated one,
    and the seconds to the verdict; then, per condition, how many causes were right and
    the p50 and p90 of those seconds over the table."""
    heads = {"quiet": "no added load", "loaded": "two burners"}
    names = [row["entry"] for row in next(iter(conditions.values()))["rows"]]
    lines = ["| entry | stated cause | " + " | ".join(
        f"{heads[c]}: verdict | cause right | time to verdict" for c in conditions) + " |",
        "|---|---|" + "---|---|---|" * len(conditions)]
    for name in names:
        cells = []
        for found in conditions.values():
            row = next(r for r in found["rows"] if r["entry"] == name)
            right = "yes" if row.get("cause_right") else f"no ({row.get('cause')})"
            cells += [row["got"], right, f"{row['seconds']:.1f} s"]
        label = f"scripts/{name}" if name.endswith(".py") else name
        lines.append(f"| {label} | {CAUSES[name]} | " + " | ".join(cells) + " |")
    lines.append("")
    for condition, found in conditions.items():
        times = [r["seconds"] for r in found["rows"]]
        right = sum(bool(r.get("cause_right")) for r in found["rows"])
        lines.append(f"- {heads[condition]} (load {_load(found)}): cause right {right} of "
                     f"{len(times)}; time to verdict p50 {percentile(times, 0.5):.1f} s, p90 "
                     f"{percentile(times, 0.9):.1f} s.")
    return lines


def write_report(path: Path, conditions: dict[str, dict[str, Any]]) -> None:
    kept = ""
    if path.exists() and KEPT_FROM in path.read_text():
        kept = path.read_text()[path.read_text().index(KEPT_FROM):]
    import torch

    cpus = len(os.sched_getaffinity(0))
    wrong = sum(not r["match"] for d in conditions.values() for r in d["rows"])
    totals = ", ".join(f"{c} {sum(r['seconds'] for r in d['rows']):.0f} s"
                       for c, d in conditions.items())
    text = [
        "# Verdicts on a quiet and on a loaded machine", "",
        f"Measured on {time.strftime('%Y-%m-%d')} by `bench/bench_verdicts.py` on {cpus} "
        f"CPUs (torch {torch.__version__}, no GPU): every fault-zoo entry diagnosed in a "
        f"watched child (as `nsadiag env --self-test` does; the time is the trial's or the "
        f"check's), and every script of `repro/scripts/` run under `nsadiag run` with the "
        f"options and the environment its docstring gives (the time is the whole `nsadiag "
        f"run`, from start to the verdict; a script that asks a question at the terminal is "
        f"answered {ANSWER_AFTER_S:.0f} s past the stall timeout after it asked, and that "
        f"wait is in its time), first with no load added, then with two `python -c 'while True: "
        f"pass'` burners. The machine is shared with other work, so the column without added "
        f"load is not a quiet machine: each column gives the 1-minute load averages read at the "
        f"end of its runs (measured in parts, the lowest and the highest).", "",
        *table(conditions), "",
        f"Time in all: {totals}. Verdicts other than expected: {wrong}.", "",
    ]
    path.write_text("\n".join(text) + ("\n" + kept if kept else ""))


CAUSES_SECTION = "## Causes and time to verdict"


def write_causes(path: Path, conditions: dict[str, dict[str, Any]]) -> None:
    """The cause table (cause_table) as the CAUSES_SECTION of ``path``, replacing that
    section where it stands and keeping every other section."""
    text = path.read_text() if path.exists() else ""
    section = "\n".join([
        CAUSES_SECTION, "",
        f"Measured on {time.strftime('%Y-%m-%d')} by `bench/bench_verdicts.py --causes-out`, "
        f"in the same runs as the table above: every fault-zoo entry as the self-test "
        f"diagnoses it (the time is the trial's or the check's) and every script of "
        f"`repro/scripts/` under `nsadiag run` (in a pseudo-terminal, `script -qfec`, where "
        f"the bench ran with --pty; the time is the whole `nsadiag run`, start-up included), "
        f"with no load added and with two burners. \"cause right\": the cause the finding "
        f"printed (a stuck run's wait-chain end, the slow class, the container that retains "
        f"a growing memory or else a peak, the collective mismatch or the signal a process "
        f"died of, the exception raised, how a busy stall's stacks read, the check that "
        f"failed) is the one the entry's docstring states (`CAUSES` in the bench). The "
        f"p50 and p90 are nearest-rank percentiles over every entry of the table.", "",
        *cause_table(conditions), ""])
    if CAUSES_SECTION in text:
        before, after = text.split(CAUSES_SECTION, 1)
        rest = after[after.index("\n## "):] if "\n## " in after else ""
        text = before + section + rest
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


HELDOUT = REPO / "repro" / "heldout"
HELDOUT_SECTION = "## Held-out scripts"


def heldout_spec(path: Path) -> dict[str, Any]:
    """A held-out script's four stated lines (see the module docstring), parsed."""
    import ast

    text = ast.get_docstring(ast.parse(path.read_text())) or ""
    fields = {}
    for line in text.splitlines():
        for label in ("Expected verdict", "Run", "Cause words", "Next words"):
            if line.startswith(f"{label}:"):
                fields[label] = line.split(":", 1)[1].strip()
    options, _, command_text = fields["Run"].removeprefix("nsadiag run").partition(" -- ")
    return {"expected": fields["Expected verdict"].split()[0],
            "options": shlex.split(options),
            "command": heldout_command(command_text),
            "cause_words": [w.strip() for w in fields["Cause words"].split("|") if w.strip()],
            "next_words": [w.strip() for w in fields["Next words"].split("|") if w.strip()]}


def heldout_command(text: str) -> list[str]:
    """The command of a Run line with this interpreter for `python` and `torchrun`."""
    import re

    words = shlex.split(text)
    if words and words[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *words[1:]]
    return [re.sub(r"(?<![\w/.-])python3?(?![\w.-])", sys.executable, word)
            if i == 0 or " " in word or word in ("python", "python3") else word
            for i, word in enumerate(words)]


def run_heldout(path: Path, out: Path, pty: bool = False) -> dict[str, Any]:
    """One held-out script under `nsadiag run` as its docstring says: its verdict, whether
    its cause and its Next are the right ones, and the seconds to the verdict."""
    spec = heldout_spec(path)
    argv = [sys.executable, "-m", "nsadiag.cli", "run", *spec["options"], "--out", str(out),
            "--", *spec["command"]]
    if pty:
        argv = ["script", "-qfec", shlex.join(argv), "/dev/null"]
    started = time.monotonic()
    returncode, output = _drive(argv, dict(os.environ), None, 0.0, 900)
    seconds = time.monotonic() - started
    try:
        finding = json.loads((out / "summary.json").read_text())["finding"]
        got = finding["verdict"]
    except (OSError, ValueError, KeyError):
        finding, got = {}, f"exit {returncode}"
    culprit = finding.get("culprit") or {}
    told = " ".join(str(part) for part in (
        culprit.get("where"), culprit.get("code"), culprit.get("why"), finding.get("chain"),
        finding.get("proof"), finding.get("line_note")) if part).lower()
    said = (finding.get("next_action") or "").split(" Rerun: ")[0]
    return {"entry": path.name, "kind": "heldout", "expected": spec["expected"], "got": got,
            "match": got == spec["expected"], "seconds": seconds,
            "cause_right": any(w.lower() in told for w in spec["cause_words"]),
            "next_right": any(w.lower() in said.lower() for w in spec["next_words"]),
            "cause_words": spec["cause_words"], "next_words": spec["next_words"],
            "line": culprit.get("where"), "chain": finding.get("chain"),
            "proof": finding.get("proof"), "next": said}


def heldout_condition(paths: list[Path], burners: int, pty: bool = False) -> dict[str, Any]:
    """Every held-out script in one condition (quiet, or with ``burners``)."""
    def run(tmp: Path) -> list[dict[str, Any]]:
        rows = []
        for path in paths:
            row = run_heldout(path, tmp / path.stem, pty)
            rows.append(row)
            print(f"{'loaded' if burners else 'quiet '} {row['entry']:<34} "
                  f"{row['expected']:<17} {row['got']:<17} cause "
                  f"{'right' if row['cause_right'] else 'wrong'} next "
                  f"{'right' if row['next_right'] else 'wrong'} {row['seconds']:6.1f} s",
                  flush=True)
        return rows
    return under_load(burners, run)


def heldout_table(conditions: dict[str, dict[str, Any]]) -> list[str]:
    """The held-out section: a row per script and condition, then the counts and the
    time to verdict (p50, p90) per condition."""
    lines = ["| script | expected | condition | verdict | cause | Next | s |",
             "|---|---|---|---|---|---|---|"]
    for condition, found in conditions.items():
        for row in found["rows"]:
            lines.append(f"| {row['entry']} | {row['expected']} | {condition} | {row['got']} | "
                         f"{'right' if row['cause_right'] else 'wrong'} | "
                         f"{'right' if row['next_right'] else 'wrong'} | "
                         f"{row['seconds']:.0f} |")
    lines += ["", "| condition | load (1-min, end) | verdict right | cause right | Next right "
                  "| time to verdict p50 / p90 |", "|---|---|---|---|---|---|"]
    for condition, found in conditions.items():
        rows = found["rows"]
        times = [row["seconds"] for row in rows] or [0.0]
        lines.append(f"| {condition} | {found['load'][1]:.1f} | "
                     f"{sum(r['match'] for r in rows)} of {len(rows)} | "
                     f"{sum(r['cause_right'] for r in rows)} of {len(rows)} | "
                     f"{sum(r['next_right'] for r in rows)} of {len(rows)} | "
                     f"{percentile(times, 0.5):.0f} s / {percentile(times, 0.9):.0f} s |")
    return lines


def write_heldout(path: Path, conditions: dict[str, dict[str, Any]]) -> None:
    """The held-out table as HELDOUT_SECTION of ``path`` (replacing that section)."""
    section = [HELDOUT_SECTION, "",
               "Scripts of repro/heldout/, written for this table by someone who had not read "
               "nsadiag's code, each stating its verdict, the words a right cause names and "
               "the words a right Next gives; run once, after the code was written, and not "
               "tuned to afterwards. A cause is right when one of its words is in the top "
               "block's Line, Waits or Proof; a Next when one of its words is in the Next.",
               "", *heldout_table(conditions), ""]
    text = path.read_text() if path.exists() else ""
    if HELDOUT_SECTION in text:
        before, after = text.split(HELDOUT_SECTION, 1)
        rest = after.split("\n## ", 1)
        text = before + "\n".join(section) + ("\n## " + rest[1] if len(rest) > 1 else "")
    else:
        text = text.rstrip() + "\n\n" + "\n".join(section)
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--conditions", default="quiet,loaded")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--from-json", type=Path, nargs="*", default=None)
    parser.add_argument("--pty", action="store_true",
                        help="run each script's nsadiag in a pseudo-terminal (script -qfec)")
    parser.add_argument("--causes-out", type=Path, default=None,
                        help="write the cause table into this Markdown file's own section")
    parser.add_argument("--heldout", action="store_true",
                        help="run repro/heldout/ instead (its own section of --out)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    if args.heldout:
        paths = sorted(p for p in HELDOUT.glob("*.py") if p.name != "__init__.py")
        if args.only:
            paths = [p for p in paths if p.name in args.only or p.stem in args.only]
        conditions = json.loads(args.from_json[0].read_text()) if args.from_json else {
            c: heldout_condition(paths, 2 if c == "loaded" else 0, args.pty)
            for c in args.conditions.split(",")}
        if args.json:
            args.json.write_text(json.dumps(conditions, indent=1))
        if args.out:
            write_heldout(args.out, conditions)
        return
    from repro import ZOO

    names = [*ZOO, *SCRIPT_RUNS]
    if args.only:
        names = [name for name in names if name in args.only]
    if args.from_json:
        conditions = merged([json.loads(path.read_text()) for path in args.from_json])
    else:
        conditions = {c: one_condition(names, 2 if c == "loaded" else 0, args.pty)
                      for c in args.conditions.split(",")}
    if args.json:
        args.json.write_text(json.dumps(conditions, indent=1))
    if args.out:
        write_report(args.out, conditions)
    if args.causes_out:
        write_causes(args.causes_out, conditions)


if __name__ == "__main__":
    main()
