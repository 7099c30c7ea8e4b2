"""nsadiag's commands: parse the options, call one library function, print the result.

Every command ends by printing what it wrote. Every error a user can cause is one line on
stderr and exit code 2, and leaves no run directory behind; Ctrl-C (and SIGTERM, SIGHUP)
kill the children, write what was found so far where the command can (nsadiag run), and
exit 128 + the signal (130, 143, 129) with where the finished trials are. Exit codes: 0
healthy, 1 failure found, 2 usage or I/O error (a bad option, an unwritable --out or full
disk, a closed stdout), 3 regression, 4 inconclusive, 70 internal error.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from typer.core import TyperGroup

from nsadiag import __version__, limits, plan
from nsadiag.cli.options import (
    ALL_TRIAL,
    IN_PROCESS,
    AsJson,
    Branch,
    CheckName,
    DdpBackend,
    LayerRange,
    Layers,
    NoRedact,
    Out,
    TrialOptions,
    WorldSize,
    run_dir,
    trial_options,
)
from nsadiag.cli.render import (
    Follow,
    OutputClosed,
    Terminal,
    activity,
    check_table,
    compare_tables,
    env_table,
    memory_tables,
    self_test_table,
    stacks_tables,
    trace_tables,
    wrote,
)
from nsadiag.harness import stop
from nsadiag.rundir import discard_on_refusal
from nsadiag.spec import STALL_TIMEOUT_S

EXIT_USAGE, EXIT_INTERNAL = 2, 70
ClickError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
"""click's ClickException (typer vendors click and names only BadParameter, a subclass):
every parser error — bad value, missing argument, unknown option or command."""
NOT_TRIAL = ("memory_cap_mb",)
"""Trial options a command runs without (ddp ranks get no address-space cap)."""


class _Commands(TyperGroup):
    """The command group, whose every way out is an exit code and at most one line on
    stderr, however it is invoked (the console script, ``app()``, a test's runner)."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        words = [str(word) for word in (sys.argv[1:] if args is None else args)]
        code = _exit_code(lambda: (_version_alone(words), super(_Commands, self).main(
            args, prog_name or "nsadiag", complete_var, standalone_mode=False, **extra))[1])
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True,
                  rich_markup_mode="markdown", pretty_exceptions_enable=False,
                  help="Tell slow from stuck and wrong from fast in PyTorch training runs.")
term = Terminal()
T = TypeVar("T")


def fail(message: str) -> NoReturn:
    """One line on stderr, exit 2."""
    term.error(message)
    raise typer.Exit(EXIT_USAGE)


def call(function: Callable[..., T], *args: Any, out: Path | None = None,
         **kwargs: Any) -> T:
    """Run one library function: a ValueError is one line and exit 2 (a run directory it
    created is removed again); Ctrl-C is one line and exit 130 (143 for SIGTERM, 129 for
    SIGHUP), after what an interrupted command wrote (``stop.Kept``) is shown."""
    try:
        with discard_on_refusal(out):
            return function(*args, **kwargs)
    except ValueError as err:
        fail((str(err) or type(err).__name__).splitlines()[0])
    except stop.Kept as stopped:
        wrote(term, stopped.kept)
        resume = (f"; rerun with --out {out} to resume" if out is not None and
                  (out / "trials.jsonl").exists() else "")
        term.note(f"nsadiag: interrupted by {stop.cause()}: children killed; what was "
                  f"found so far is written{resume}")
        raise typer.Exit(stop.exit_code()) from None
    except KeyboardInterrupt:
        kept = out is not None and (out / "trials.jsonl").exists()
        hint = (f"; finished trials are kept in {out}/trials.jsonl; rerun with --out {out} "
                f"to resume" if kept else "")
        term.note(f"nsadiag: interrupted: children killed{hint}")
        raise typer.Exit(stop.exit_code()) from None


def _announce(sentence: str | None) -> None:
    """A long plan's worst-case time, on stderr before it starts."""
    if sentence:
        term.note(sentence)


def redaction(no_redact: bool) -> None:
    term.redact = not no_redact
    term.show_hosts([])  # shown once this command's report names them


def argv() -> list[str]:
    """The command as a user would type it again."""
    return ["nsadiag", *sys.argv[1:]]


def _version(value: bool) -> None:
    if value:
        term.print(f"nsadiag {__version__}")
        raise typer.Exit(0)


def _version_alone(args: list[str]) -> None:
    """``--version`` exits at once (an eager option), before the words after it are read:
    refuse any (``nsadiag --version extra``) as the parser refuses an extra argument."""
    if args[:1] == ["--version"] and args[1:]:
        raise _UsageError(f"version: --version takes no other arguments, got "
                          f"{' '.join(args[1:])!r} (see nsadiag --help)")


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print the version and exit.")] = False) -> None:
    """nsadiag: diagnostics for PyTorch training runs: slow or stuck, wrong or fast."""


# ---- env ------------------------------------------------------------------------------------


@app.command(epilog="Example: nsadiag env --self-test")
def env(as_json: AsJson = False,
        self_test: Annotated[bool, typer.Option(
            "--self-test", help="Diagnose every fault-zoo entry; exit 1 on a wrong verdict.")]
        = False) -> None:
    """Versions, devices, profilers and permissions of this machine."""
    if self_test:
        from nsadiag.commands.selftest import self_test as run_zoo

        with term.status("self-test: diagnosing the fault zoo") as update:
            rows = call(run_zoo, on_entry=lambda name, i, n: update(f"{name} ({i + 1} of {n})"))
        if as_json:
            term.json(rows)
        else:
            self_test_table(term, rows)
        raise typer.Exit(0 if all(r["match"] for r in rows) else 1)
    from nsadiag.commands.env import env_report

    with term.status("env") as update:
        update("collecting versions, devices and permissions")
        report = call(env_report)
    if as_json:
        term.json(report)
    else:
        env_table(term, report)


# ---- sweeps ---------------------------------------------------------------------------------


def _sweep(function: Callable[..., Any], *args: Any, out: Path, total: int | None,
           plan_note: str | None = None, by_branch: bool = False, **kwargs: Any) -> NoReturn:
    with Follow(term, total, by_branch=by_branch) as follow:
        from nsadiag.sweep import Callbacks

        callbacks = Callbacks(on_trial=follow.on_trial, on_events=follow.on_events,
                              on_record=follow.on_record,
                              on_plan=lambda: _announce(plan_note))
        rendered = call(function, *args, callbacks=callbacks, out=out, **kwargs)
    raise typer.Exit(wrote(term, rendered))


@app.command("sweep-layers",
             epilog="Example: nsadiag sweep-layers --layers 1-8 --seq-len 1024 --budget 300")
@trial_options(seq_len=2048)
def sweep_layers_cmd(
        trial: TrialOptions, layers: LayerRange = "1-12", out: Out = None,
        keep_going: Annotated[bool, typer.Option(
            "--keep-going", help="Run every count, past the first non-OK.")] = False) -> None:
    """One watched trial per layer count: verdicts, time and memory fits, report."""
    from nsadiag.commands.sweep import sweep_layers
    from nsadiag.sweep import parse_layers

    counts = call(parse_layers, layers)
    call(trial.within_limits, limits.check_layer_counts, counts)
    base = call(trial.spec)
    path = call(run_dir, out, "sweep-layers")
    _sweep(sweep_layers, base, counts, path, argv(), out=path, total=len(counts),
           plan_note=plan.sweep_plan("sweep-layers", len(counts), base), keep_going=keep_going)


@app.command("sweep-seq",
             epilog="Example: nsadiag sweep-seq --seq-lens 512,1024,2048 --layers 2")
@trial_options(tuple(n for n in ALL_TRIAL if n != "seq_len"))
def sweep_seq_cmd(
        trial: TrialOptions,
        seq_lens: Annotated[str, typer.Option(
            "--seq-lens", help='Sequence lengths: "512,1024,2048".')] = "512,1024,2048,4096",
        layers: Layers = 2, out: Out = None,
        keep_going: Annotated[bool, typer.Option(
            "--keep-going", help="Run every length, past the first non-OK.")] = False) -> None:
    """One watched trial per sequence length: time and peak memory against S, the bytes
    saved for backward and the rest of the peak, fits, and the predicted memory cliff."""
    from nsadiag.commands.sweep import sweep_seq
    from nsadiag.sweep import parse_seq_lens

    lengths = call(parse_seq_lens, seq_lens)
    call(trial.within_limits, limits.check_sweep, lengths, "seq-lens")
    call(trial.within_limits, limits.check_tokens, max(lengths), trial.batch, "seq-lens")
    base = call(trial.spec, seq_len=min(lengths), n_layers=layers)
    path = call(run_dir, out, "sweep-seq")
    _sweep(sweep_seq, base, lengths, path, argv(), out=path, total=len(lengths),
           plan_note=plan.sweep_plan("sweep-seq", len(lengths), base), keep_going=keep_going)


@app.command("isolate-branch",
             epilog="Example: nsadiag isolate-branch sel --layers 1-4 --seq-len 2048")
@trial_options(seq_len=2048)
def isolate_branch_cmd(trial: TrialOptions, branch: Branch, layers: LayerRange = "1-4",
                       out: Out = None) -> None:
    """The layer sweep with only BRANCH computed, beside all three branches."""
    from nsadiag.commands.sweep import isolate_branch
    from nsadiag.sweep import parse_layers

    counts = call(parse_layers, layers)
    call(trial.within_limits, limits.check_layer_counts, counts)
    base = call(trial.spec)
    path = call(run_dir, out, "isolate-branch")
    _sweep(isolate_branch, base, branch, counts, path, argv(), out=path,
           total=2 * len(counts), by_branch=True,
           plan_note=plan.sweep_plan("isolate-branch", 2 * len(counts), base))


# ---- triage ---------------------------------------------------------------------------------


@app.command("triage", epilog="Example: nsadiag triage --target repro.per_token_loop:make "
                              "--seq-len 512 --max-minutes 8")
@trial_options(seq_len=2048)
def triage_cmd(
        trial: TrialOptions,
        max_layers: Annotated[int, typer.Option(
            "--max-layers", min=1, help="Deepest layer count the sweep may try.")] = 8,
        max_minutes: Annotated[float, typer.Option(
            "--max-minutes", help="Wall-clock limit of the whole triage.")] = 10.0,
        world_size: Annotated[int, typer.Option(
            "--world-size", min=1, help="Processes per trial; above 1 each trial runs "
            "under torchrun (nsadiag ddp).")] = 1,
        ddp_backend: DdpBackend = "gloo",
        checks: Annotated[bool, typer.Option(
            "--checks/--no-checks", help="Correctness checks before the sweep.")] = True,
        isolate: Annotated[bool, typer.Option(
            "--isolate/--no-isolate", help="Branch isolation on a failure.")] = True,
        bisect: Annotated[bool, typer.Option(
            "--bisect/--no-bisect", help="Knob bisection on a failure.")] = True,
        ci: Annotated[bool, typer.Option(
            "--ci", help="Plain output, and the report appended to $GITHUB_STEP_SUMMARY.")]
        = False,
        baseline: Annotated[Path | None, typer.Option(
            "--baseline", help="summary.json (or run directory) to compare step time and "
            "peak memory with; exit 3 on a regression.")] = None,
        regression_threshold: Annotated[float, typer.Option(
            "--regression-threshold",
            help="Relative slowdown or growth that counts as a regression.")] = 0.2,
        no_redact: NoRedact = False, out: Out = None) -> None:
    """Env doctor, checks, layer threshold, repeats, branch isolation and knob bisection to
    a minimal failing configuration; report. Exit 0 healthy, 1 failure, 2 usage,
    3 regression, 4 inconclusive."""
    from nsadiag.commands.triage import TriageCallbacks, TriageOptions, triage

    redaction(no_redact)
    call(trial.within_limits, limits.check_layers, max_layers, "max-layers")
    call(trial.within_limits, limits.check_world_size, world_size)
    base = call(trial.spec)
    options = TriageOptions(max_layers=max_layers, max_minutes=max_minutes, checks=checks,
                            isolate=isolate, bisect=bisect, world_size=world_size,
                            ddp_backend=ddp_backend, no_redact=no_redact)
    path = call(run_dir, out, "triage")
    with Follow(term, None, plain=ci) as follow:
        callbacks = TriageCallbacks(on_trial=follow.on_trial, on_events=follow.on_events,
                                    on_record=follow.on_record, on_stage=follow.on_stage,
                                    on_plan=lambda: _announce(plan.triage_plan(max_minutes)))
        outcome = call(triage, base, options, path, argv(), callbacks=callbacks,
                       baseline=baseline, regression_threshold=regression_threshold, ci=ci,
                       out=path)
    wrote(term, outcome.report, [outcome.step_summary] if outcome.step_summary else [])
    raise typer.Exit(outcome.exit_code)


@app.command("compare", epilog="Example: nsadiag compare runs/before runs/after --threshold 0.1")
def compare_cmd(
        before: Annotated[Path, typer.Argument(help="Run directory or summary.json.")],
        after: Annotated[Path, typer.Argument(help="Run directory or summary.json.")],
        threshold: Annotated[float, typer.Option(
            "--threshold", help="Relative growth that counts as a regression.")] = 0.2,
        as_json: AsJson = False,
        force: Annotated[bool, typer.Option(
            "--force", help="Compare runs whose configurations differ.")] = False) -> None:
    """Diff two runs' summary.json: verdict changes, step time and peak memory; exit 3 on a
    regression (a change above the threshold and above the runs' measured spread)."""
    from nsadiag.ci import EXIT_REGRESSION
    from nsadiag.compare import compare_runs

    result = call(compare_runs, before, after, threshold, force)
    if as_json:
        term.json(result)
    else:
        compare_tables(term, result, threshold)
    worse = any(change.get("failure_now") for change in result["verdict_changes"])
    raise typer.Exit(EXIT_REGRESSION if result["regressions"] or worse else 0)


@app.command("merge", epilog="Example: nsadiag merge runs/host1 runs/host2")
def merge_cmd(
        run_dirs: Annotated[list[Path], typer.Argument(
            metavar="DIR...", help="The run directories of one job's hosts, one per host.")],
        as_json: AsJson = False) -> None:
    """The verdict of a multi-host job from its hosts' `nsadiag run` directories, copied
    together: every host's ranks decided together. Exit 1 when it is a failure."""
    from nsadiag.hosts.offline import merge_run_dirs
    from nsadiag.verdict.names import is_failure

    verdict = call(merge_run_dirs, run_dirs)
    term.show_hosts((verdict.facts.ranks.hosts or {}).get("hosts") or [])
    if as_json:
        term.json(verdict.to_dict())
    else:
        chain = verdict.facts.stall.wait_chain.printed if verdict.facts.stall.wait_chain \
            else None
        straggler = verdict.facts.ranks.straggler.sentence if verdict.facts.ranks.straggler \
            else None
        for line in [f"{verdict.name}: {verdict.reasons[0]}",
                     *([f"wait chain: {chain}"] if chain else []),
                     *([straggler] if straggler else [])]:
            term.print(line)
    raise typer.Exit(1 if is_failure(verdict.name, verdict.facts.slow.slow_by) else 0)


# ---- one trial: ddp, run ----------------------------------------------------------------------


@app.command("ddp", epilog="Example: nsadiag ddp --world-size 2 --target "
                           "repro.rank_divergent:make --seq-len 64 --stall-timeout 3")
@trial_options(tuple(n for n in ALL_TRIAL if n not in NOT_TRIAL), seq_len=256,
               stall_timeout=30.0, device="cpu")
def ddp_cmd(
        trial: TrialOptions, world_size: WorldSize = 2, ddp_backend: DdpBackend = "gloo",
        layers: Layers = None,
        pg_timeout: Annotated[float | None, typer.Option(
            "--pg-timeout", help="Process-group timeout in seconds; default 2 x stall "
            "timeout + 60.")] = None,
        no_redact: NoRedact = False, out: Out = None) -> None:
    """One trial under torchrun: per-rank heartbeats and collectives, who waits where.
    --ddp-backend nccl needs --device cuda (one GPU per rank)."""
    from nsadiag.commands.ddp import ddp_command

    redaction(no_redact)
    call(trial.within_limits, limits.check_world_size, world_size)
    base = call(trial.spec, n_layers=layers)
    path = call(run_dir, out, "ddp")
    note = plan.announce("ddp", 1, base, "--budget")
    with term.status("ddp") as update:
        def on_events(batch: list[dict]) -> None:
            if term.live and batch:
                update(f"{world_size} ranks ({ddp_backend}): {activity(batch[-1])}")

        def on_start(text: str) -> None:
            _announce(note)
            update(text)

        rendered = call(ddp_command, base, world_size, ddp_backend, path, argv(),
                        pg_timeout_s=pg_timeout, on_events=on_events, no_redact=no_redact,
                        on_start=on_start, out=path)
    raise typer.Exit(wrote(term, rendered))


@app.command("run", context_settings={"allow_extra_args": True,
                                      "ignore_unknown_options": True},
             epilog="Example: nsadiag run --stall-timeout 60 -- python train.py --lr 3e-4")
def run_cmd(
        ctx: typer.Context,
        stall_timeout: Annotated[float, typer.Option(
            "--stall-timeout", help="Seconds without progress in any process before "
            "the run counts as stalled.")] = STALL_TIMEOUT_S,
        deadline: Annotated[float, typer.Option(
            "--deadline", help="Your job's own time limit: a run still progressing "
            "then is SLOW, with its rate.")] = 3600.0,
        no_redact: NoRedact = False, out: Out = None) -> None:
    """Run your own command unchanged and watch every Python process it starts:
    nsadiag run -- python train.py (or torchrun ... train.py)."""
    from nsadiag.cli.live import live_status
    from nsadiag.commands.run import run_user_command

    redaction(no_redact)
    if ctx.args and ctx.args[0].startswith("-"):  # an option of run's the parser passed on
        fail(f"No such option: {ctx.args[0]} (see nsadiag run --help); the command to "
             f"watch goes after --: nsadiag run [OPTIONS] -- python train.py")
    path = call(run_dir, out, "run")
    rendered = call(run_user_command, list(ctx.args), path, argv(), stall_timeout, deadline,
                    no_redact=no_redact, out=path,
                    on_start=lambda text: term.note(f"nsadiag run: {text}"), on_note=term.note,
                    live=live_status(term, path, stall_timeout, deadline))
    raise typer.Exit(wrote(term, rendered))


# ---- in-process probes: memory, trace, check, stacks --------------------------------------------


@app.command("memory", epilog="Example: nsadiag memory --layers 4 --seq-len 4096")
@trial_options((*IN_PROCESS, "steps"), seq_len=2048)
def memory_cmd(
        trial: TrialOptions, layers: Layers = None,
        top: Annotated[int, typer.Option("--top", min=1,
                                         help="Rows of modules and tensors shown.")] = 10,
        ab_expandable_segments: Annotated[bool, typer.Option(
            "--ab-expandable-segments",
            help="Measure again in children without and with expandable segments (CUDA).")]
        = False,
        as_json: AsJson = False, no_redact: NoRedact = False, out: Out = None) -> None:
    """Bytes saved for backward per module, branch and layer, peak memory, CUDA history;
    report.md with a plot on every device."""
    from nsadiag.commands.memory import memory_run

    redaction(no_redact)
    spec = call(trial.spec, n_layers=layers)
    path = call(run_dir, out, "memory")
    with term.status("memory") as update:
        rendered = call(memory_run, spec, path, argv(), top, ab_expandable_segments,
                        no_redact, on_start=update, out=path)
    if not as_json:
        memory_tables(term, rendered.summary, top)
    raise typer.Exit(wrote(term, rendered, as_json=as_json))


@app.command("trace", epilog="Example: nsadiag trace --layers 4 --seq-len 2048 --profiler")
@trial_options((*IN_PROCESS, "steps"), seq_len=2048, steps=3)
def trace_cmd(
        trial: TrialOptions, layers: Layers = None,
        profiler: Annotated[bool, typer.Option(
            "--profiler", help="Also record one step under torch.profiler with the module "
            "and branch spans as record_function ranges (profiler-trace.json).")] = False,
        as_json: AsJson = False, no_redact: NoRedact = False, out: Out = None) -> None:
    """Steps under autograd hooks: timeline, Perfetto trace, gradient anomalies; --steps
    traced steps, each beside an untraced one for the overhead."""
    from nsadiag.commands.trace import trace_run

    redaction(no_redact)
    spec = call(trial.spec, n_layers=layers)
    path = call(run_dir, out, "trace")
    with term.status("trace") as update:
        rendered = call(trace_run, spec, path, argv(), profiler, update, no_redact, out=path)
    if not as_json:
        trace_tables(term, rendered.summary)
    raise typer.Exit(wrote(term, rendered, as_json=as_json))


@app.command("check", epilog="Example: nsadiag check all --target mypkg.model:make")
@trial_options(("target", "preset", "set_", "seq_len", "batch", "device", "backend", "steps",
                "stall_timeout", "budget", "startup_grace", "seed", "no_limits"), seq_len=2048,
               batch=2, steps=1)
def check_cmd(
        trial: TrialOptions, check: CheckName, layers: Layers = None,
        world_size: Annotated[int, typer.Option(
            "--world-size", help="Ranks of the ddp check (at least 2).")] = 2,
        as_json: AsJson = False, no_redact: NoRedact = False, out: Out = None) -> None:
    """Correctness checks: WRONG naming the first module that differs; exit 1 on a failure.
    They run at the trial commands' sequence length; causality also runs a second pass at
    a longer one where the budget allows (a leak past a sliding window shows only there)."""
    from nsadiag.commands.check import check_command

    redaction(no_redact)
    if check in ("ddp", "all"):
        call(trial.within_limits, limits.check_world_size, world_size)
    spec = call(trial.spec, n_layers=layers, steps=1)
    path = call(run_dir, out, "check")

    def planned() -> None:
        if trial.steps != 1:
            term.note(f"nsadiag check: --steps {trial.steps} does not change the checks: each "
                      f"compares one forward and backward of the model")
        _announce(plan.check_plan(spec, check))

    with term.status(f"check {check}") as update:
        _, rendered = call(check_command, [check], spec, path, argv(), world_size, no_redact,
                           on_check=lambda name, i, n: update(f"check {name} ({i + 1} of {n})"),
                           on_plan=planned, out=path)
    if not as_json:
        check_table(term, rendered.summary)
    raise typer.Exit(wrote(term, rendered, as_json=as_json))


@app.command("stacks", epilog="Example: nsadiag stacks 12345 --native --samples 3")
def stacks_cmd(
        pid: Annotated[int, typer.Argument(help="A process, or a launcher with --ranks.")],
        ranks: Annotated[bool, typer.Option(
            "--ranks", help="Sample every Python child (torchrun ranks).")] = False,
        native: Annotated[bool, typer.Option("--native", help="Native frames too.")] = False,
        samples: Annotated[int, typer.Option("--samples", help="Samples per process.")] = 3,
        interval: Annotated[float, typer.Option(
            "--interval", help="Seconds between samples.")] = 1.0,
        as_json: AsJson = False, no_redact: NoRedact = False, out: Out = None) -> None:
    """What a live process is doing: sampled stacks, CPU use, waiting or busy, and every
    thread that matters (one blocked on a lock too)."""
    from nsadiag.commands.stacks import stacks_run

    redaction(no_redact)
    call(limits.check_stack_sampling, samples, interval)
    path = call(run_dir, out, "stacks")
    with term.status("stacks") as update:
        rendered = call(stacks_run, pid, ranks, samples, interval, native, path, argv(),
                        no_redact, on_start=update, out=path)
    if not as_json:
        stacks_tables(term, rendered.summary)
    raise typer.Exit(wrote(term, rendered, as_json=as_json))


@app.command("attach", epilog="Example: nsadiag attach 12345 30 --ranks")
def attach_cmd(
        pid: Annotated[int, typer.Argument(help="A live process, or a torchrun launcher with "
                                                "--ranks.")],
        seconds: Annotated[float | None, typer.Argument(
            metavar="[SECONDS]", help="Seconds to watch it (as --duration).")] = None,
        duration: Annotated[float, typer.Option(
            "--duration", help="Seconds to watch it.")] = 20.0,
        ranks: Annotated[bool, typer.Option(
            "--ranks", help="Watch every rank under PID (torchrun).")] = False,
        as_json: AsJson = False, no_redact: NoRedact = False, out: Out = None) -> None:
    """Watch a live process for DURATION seconds without restarting or killing it:
    progressing, stuck (busy or idle) or waiting in a collective, with its evidence."""
    from nsadiag.commands.attach import attach_command

    redaction(no_redact)
    if seconds is not None:
        if duration != 20.0 and duration != seconds:
            fail(f"duration: given twice ({seconds:g} and --duration {duration:g}); give one")
        duration = seconds
    call(limits.check_watch_seconds, duration, "duration")
    path = call(run_dir, out, "attach")
    with term.status(f"attach to {'the ranks under ' if ranks else ''}pid {pid}") as update:
        rendered = call(attach_command, pid, duration, ranks, path, argv(), no_redact,
                        on_start=update, out=path)
    raise typer.Exit(wrote(term, rendered, as_json=as_json))


# ---- report ---------------------------------------------------------------------------------


@app.command("report", epilog="Example: nsadiag report runs/20261122T061500Z-sweep-layers "
                              "--bundle")
def report_cmd(
        run_dir_: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run directory.")],
        no_redact: NoRedact = False,
        bundle: Annotated[bool, typer.Option(
            "--bundle", help="Also write a redacted archive of the whole run directory, for "
            "sharing.")] = False) -> None:
    """Re-render report.md and summary.json of RUN_DIR from its stored records (any run
    kind). Exits 0 when it rendered, whatever the run found (summary.json's exit_code
    says that)."""
    from nsadiag.report.bundle import write_bundle
    from nsadiag.report.dispatch import render_locked

    if bundle and no_redact:
        fail("bundle: a bundle is always redacted; drop --no-redact")
    redaction(no_redact)
    from nsadiag.rundir import left_aside

    for stale in left_aside(run_dir_):
        term.note(f"nsadiag report: an earlier run of {run_dir_}, set aside by an nsadiag "
                  f"that was killed during a rerun, is in {stale}")
    rendered = call(render_locked, run_dir_, no_redact)
    extra = [call(write_bundle, run_dir_)] if bundle else []
    wrote(term, rendered, extra)


# ---- entry point ------------------------------------------------------------------------------


def _interrupt(signum: int, frame: Any) -> None:
    stop.request(signum)  # the wait loops raise again should this one be swallowed
    raise KeyboardInterrupt  # so a cancelled job unwinds through the runners' kill paths


def _usage_line(err: Exception) -> str:
    """A parser error as the project words errors: "<option>: <what is wrong>", one line,
    with where to read the command's help."""
    param = getattr(err, "param", None)
    inner = getattr(err, "message", "")
    if param is not None and inner:
        name = (param.opts[0] if getattr(param, "opts", None) else param.name).lstrip("-")
        inner = inner.replace("Value error, ", "")
        message = f"{name}: {inner[:1].lower()}{inner[1:]}"
    else:
        message = err.format_message() if hasattr(err, "format_message") else str(err)
    ctx = getattr(err, "ctx", None)
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    return " ".join(message.split()).rstrip(".") + where


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _exit_code(invoke: Callable[[], Any]) -> int:
    try:
        code = invoke()
        return code if isinstance(code, int) else 0
    except typer.Abort:
        term.note("nsadiag: interrupted")
        return stop.exit_code()
    except ClickError as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # the help is printed already
            return 0
        term.error(_usage_line(err))
        return EXIT_USAGE
    except OutputClosed as err:
        _silence_stdout()
        try:
            term.error(f"{err} was closed before everything was printed (the run's files "
                       f"are written)")
        except OutputClosed:
            pass
        return EXIT_USAGE
    except KeyboardInterrupt:
        term.note("nsadiag: interrupted")
        return stop.exit_code()
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        term.error(f"{where}{err.strerror or err}")
        return EXIT_USAGE
    except Exception as err:  # a bug: one line, the traceback on request
        if os.environ.get("NSADIAG_TRACEBACK"):
            raise
        term.error(f"internal error: {type(err).__name__}: {err} (NSADIAG_TRACEBACK=1 shows "
                   f"the traceback)")
        return EXIT_INTERNAL


def run(args: list[str] | None = None) -> int:
    """Run the command line ``args`` (default sys.argv[1:]); the exit code."""
    return app(args=args, prog_name="nsadiag", standalone_mode=False)


def main() -> None:
    """The console entry point (`nsadiag`, `python -m nsadiag.cli`)."""
    # CI cancellation and `timeout` send SIGTERM: without this Python would die on the spot
    # and leave trial children and torchrun ranks (in their own sessions) running; Ctrl-C
    # takes the same handler so that it, too, is remembered (nsadiag.harness.stop)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _interrupt)
    # what a job's processes leave behind (a double fork's grandchild) comes to us, not to
    # init, so that it ends with the job even when it dropped the job's token
    from nsadiag.harness.launch import adopt_orphans

    adopt_orphans()
    valid_text_streams()
    code = run()
    if stop.requested():
        _exit_at_once(code)
    sys.exit(code)


def _replacement_character(error: UnicodeError) -> tuple[bytes, int]:
    # bytes: the UTF-8 encoder refuses a replacement str that is not ASCII
    if not isinstance(error, UnicodeEncodeError):
        raise error
    return "\ufffd".encode(error.encoding, "replace") * (error.end - error.start), error.end


def valid_text_streams() -> None:
    """What nsadiag prints is valid text: a lone surrogate in a stored string (an
    undecodable byte of a program's exception, kept by ``surrogateescape``) prints as
    U+FFFD, where a C-locale stdout would write the raw byte and a strict one raise."""
    codecs.register_error("nsadiag-replacement", _replacement_character)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="nsadiag-replacement")


def _exit_at_once(code: int) -> NoReturn:
    """End the process with `code` now, skipping the interpreter's teardown.

    CPython (3.11 at least) remembers a KeyboardInterrupt that once left source text run by
    exec or eval, even one caught later, and then ends the process by SIGINT whatever exit
    code it was given. dataclasses and namedtuples build their methods that way, so a
    signal landing while an import defines one (torch's import does, for seconds) turned
    "interrupted, exit 130" into death by SIGINT. The diagnosis is over and its children
    are killed: only the flushing of the standard streams and of logging is left to do."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the reader, or by us
            pass
    os._exit(code)
