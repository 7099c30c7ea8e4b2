"""nsadiag command line: parses options, calls the library, prints. Nothing else.

Every error a user can cause ends as one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from nsadiag.checks import CHECK_NAMES
from nsadiag.ci import EXIT_REGRESSION, exit_code
from nsadiag.commands.check import check_command
from nsadiag.commands.ddp import ddp_command
from nsadiag.commands.memory import ab_expandable_segments as ab_compare
from nsadiag.commands.memory import memory_command, require_cuda
from nsadiag.commands.selftest import self_test
from nsadiag.commands.stacks import stacks_command, write_stacks_report
from nsadiag.commands.sweep import (
    check_target,
    isolate_branch,
    sweep_layers,
    sweep_seq,
)
from nsadiag.commands.trace import trace_command
from nsadiag.commands.triage import TriageCallbacks, TriageOptions, triage
from nsadiag.compare import compare_runs
from nsadiag.envinfo import collect_env
from nsadiag.harness.runcmd import run_command
from nsadiag.render import render_run
from nsadiag.report_run import write_run_report
from nsadiag.rundir import TrialRecord, default_run_dir, prepare_run_dir
from nsadiag.spec import TrialSpec, parse_overrides
from nsadiag.sweep import Callbacks, parse_layers, parse_seq_lens
from nsadiag.triage.decide import env_problems

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Tell slow from stuck and wrong from fast in NSA training runs.")
console = Console()


def fail(message: str) -> None:
    print(f"nsadiag: error: {message}", file=sys.stderr)  # one line, never wrapped
    raise typer.Exit(2)


@app.callback()
def _root() -> None:
    """nsadiag: diagnostics for NSA training runs."""


@app.command()
def env(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
        self_test_: bool = typer.Option(False, "--self-test",
                                        help="Diagnose the fault zoo; exit 1 on a miss.")):
    """Versions, devices, profilers and permissions of this machine."""
    if self_test_:
        _self_test(as_json)
        return
    report = collect_env().as_dict()
    report["problems"] = env_problems(report, "cpu")
    if as_json:
        print(json.dumps(report, indent=1))
        return
    table = Table(show_header=False, box=None)
    for key, value in report.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = "; ".join(map(str, value)) or ("none found" if key == "problems" else "-")
        table.add_row(key, str(value))
    console.print(table)


def _self_test(as_json: bool) -> None:
    rows = self_test()
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        table = Table("zoo entry", "expected", "diagnosed", "s", "first reason")
        for row in rows:
            style = "green" if row["match"] else "red"
            table.add_row(row["entry"], row["expected"], f"[{style}]{row['got']}[/{style}]",
                          f"{row['seconds']:.0f}", row["reason"])
        console.print(table)
        console.print(f"{sum(r['match'] for r in rows)} of {len(rows)} verdicts right")
    if not all(r["match"] for r in rows):
        raise typer.Exit(1)


TARGET = typer.Option("nsa", help='"nsa" or "pkg.module:factory".')
SET = typer.Option(None, "--set", help="key=value override of a config field (repeatable).")


def _base_spec(target, overrides, seq_len, batch, dtype, grad_ckpt, device, backend, steps,
               stall_timeout, budget, memory_cap_mb, seed) -> TrialSpec:
    if stall_timeout <= 0:
        fail(f"stall-timeout: must be > 0 seconds, got {stall_timeout:g}")
    if budget <= 0:
        fail(f"budget: must be > 0 seconds, got {budget:g}")
    try:
        return TrialSpec(target=target, overrides=parse_overrides(overrides or []),
                         seq_len=seq_len, batch=batch, dtype=dtype, grad_ckpt=grad_ckpt,
                         device=device, backend=backend, steps=steps, seed=seed,
                         stall_timeout_s=stall_timeout, budget_s=budget,
                         memory_cap_bytes=memory_cap_mb * 2**20 if memory_cap_mb else None,
                         out_dir="unused").validate()
    except ValueError as err:
        fail(str(err))


def _layer_counts(text: str) -> list[int]:
    try:
        return parse_layers(text)
    except ValueError as err:
        fail(str(err))


class _Follow:
    """A rich progress bar over trials, with the heartbeat count of the running one."""

    def __init__(self, progress: Progress, total: int):
        self.progress, self.events = progress, 0
        self.task = progress.add_task("starting", total=total)

    def callbacks(self) -> Callbacks:
        return Callbacks(on_trial=self.on_trial, on_events=self.on_events,
                         on_record=self.on_record)

    def on_trial(self, point: int, spec: TrialSpec) -> None:
        self.events = 0
        label = f" {','.join(spec.branches)}" if spec.branches else ""
        self.progress.update(self.task, description=f"{spec.n_layers or '-'} layers, "
                                                    f"S={spec.seq_len}{label}")

    def on_events(self, events: list[dict]) -> None:
        self.events += len(events)
        last = events[-1]
        where = last.get("module") or last.get("kind")
        self.progress.update(self.task, description=f"{where} ({self.events} events)")

    def on_record(self, record: TrialRecord) -> None:
        verdict = record.verdict_name
        style = "green" if verdict == "OK" else "red"
        self.progress.console.print(f"{record.spec['n_layers'] or '-':>3} layers  "
                                    f"S={record.spec['seq_len']:<6} "
                                    f"[{style}]{verdict}[/{style}]  {record.wall_s:.1f} s")
        self.progress.advance(self.task)


def _run(command, *args, total: int, **options):
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
               "{task.total}"), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as progress:
            follow = _Follow(progress, total)
            return command(*args, callbacks=follow.callbacks(), **options)
    except ValueError as err:
        fail(str(err))
    except KeyboardInterrupt:
        run_dir = next(a for a in args if isinstance(a, Path))
        print(f"nsadiag: interrupted: children killed; finished trials are kept in "
              f"{run_dir}/trials.jsonl; rerun with --out {run_dir} to resume",
              file=sys.stderr)
        raise typer.Exit(130) from None


def _argv() -> list[str]:
    """The command as a user would type it again."""
    return ["nsadiag", *sys.argv[1:]]


def _print_report(report: Path) -> int:
    """Print the headline and the report's path; the exit code the run stands for."""
    summary = json.loads((report.parent / "summary.json").read_text())
    console.print(f"[bold]{summary['headline']}[/bold]")
    console.print(f"report: {report}")
    return exit_code(summary)


@app.command("sweep-layers")
def sweep_layers_cmd(
        layers: str = typer.Option("1-12", help='Layer counts: "1-12", "1,2,4", "2-12:2".'),
        target: str = TARGET, set_: list[str] = SET,
        seq_len: int = typer.Option(2048, help="Tokens per sequence."),
        batch: int = typer.Option(1), dtype: str = typer.Option("float32"),
        grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt"),
        device: str = typer.Option("cpu"), backend: str = typer.Option(None),
        steps: int = typer.Option(2, help="Training steps per trial."),
        stall_timeout: float = typer.Option(60.0, help="Seconds without a heartbeat."),
        budget: float = typer.Option(600.0, help="Seconds per trial."),
        memory_cap_mb: int = typer.Option(None, help="Address-space cap of each child."),
        seed: int = typer.Option(0), out: Path = typer.Option(None, help="Run directory."),
        keep_going: bool = typer.Option(False, "--keep-going",
                                        help="Run every count, past the first non-OK.")):
    """One watched trial per layer count: verdicts, time and memory fits, report."""
    counts = _layer_counts(layers)
    base = _base_spec(target, set_, seq_len, batch, dtype, grad_ckpt, device, backend, steps,
                      stall_timeout, budget, memory_cap_mb, seed)
    run_dir = out or default_run_dir("sweep-layers")
    raise typer.Exit(_print_report(_run(sweep_layers, base, counts, run_dir, _argv(),
                                        total=len(counts), keep_going=keep_going)))


@app.command("run", context_settings={"allow_extra_args": True,
                                      "ignore_unknown_options": True})
def run_cmd(ctx: typer.Context,
            stall_timeout: float = typer.Option(60.0, help="Seconds without progress in any "
                                                "process before the run counts as stalled."),
            deadline: float = typer.Option(3600.0, help="Your job's own time limit: a run "
                                           "still progressing then is SLOW, with its rate."),
            out: Path = typer.Option(None, help="Run directory."),
            no_redact: bool = typer.Option(False, "--no-redact",
                                           help="Keep host names, IPs and user names.")):
    """Run your own command unchanged and watch every Python process it starts:
    nsadiag run -- python train.py --lr 3e-4 (or torchrun ... train.py)."""
    argv = list(ctx.args)
    if stall_timeout <= 0 or deadline <= 0:
        fail("stall-timeout and deadline: must be > 0 seconds")
    run_dir = out or default_run_dir("run")
    try:
        prepare_run_dir(run_dir)
        record = run_command(argv, run_dir, stall_timeout, deadline)
    except ValueError as err:
        fail(str(err))
    except KeyboardInterrupt:
        print(f"nsadiag: interrupted: the command's processes were killed; {run_dir}",
              file=sys.stderr)
        raise typer.Exit(130) from None
    report = write_run_report(record, run_dir, no_redact)
    raise typer.Exit(_print_report(report))


@app.command("sweep-seq")
def sweep_seq_cmd(
        seq_lens: str = typer.Option("512,1024,2048,4096", help='Lengths: "512,1024,2048".'),
        layers: int = typer.Option(2, help="Number of layers."),
        target: str = TARGET, set_: list[str] = SET,
        batch: int = typer.Option(1), dtype: str = typer.Option("float32"),
        grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt"),
        device: str = typer.Option("cpu"), backend: str = typer.Option(None),
        steps: int = typer.Option(2, help="Training steps per trial."),
        stall_timeout: float = typer.Option(60.0, help="Seconds without progress."),
        budget: float = typer.Option(600.0, help="Seconds per trial."),
        memory_cap_mb: int = typer.Option(None, help="Address-space cap of each child."),
        seed: int = typer.Option(0), out: Path = typer.Option(None, help="Run directory."),
        keep_going: bool = typer.Option(False, "--keep-going",
                                        help="Run every length, past the first non-OK.")):
    """One watched trial per sequence length: time and peak memory against S, the bytes
    saved for backward and the rest of the peak, fits, and the predicted memory cliff."""
    try:
        lengths = parse_seq_lens(seq_lens)
    except ValueError as err:
        fail(str(err))
    base = _base_spec(target, set_, min(lengths), batch, dtype, grad_ckpt, device, backend,
                      steps, stall_timeout, budget, memory_cap_mb, seed)
    try:
        base = base.replace(n_layers=layers)
    except ValueError as err:
        fail(str(err))
    run_dir = out or default_run_dir("sweep-seq")
    raise typer.Exit(_print_report(_run(sweep_seq, base, lengths, run_dir, _argv(),
                                        total=len(lengths), keep_going=keep_going)))


@app.command("isolate-branch")
def isolate_branch_cmd(
        branch: str = typer.Argument(..., help="win, sel or cmp."),
        layers: str = typer.Option("1-4"), target: str = TARGET, set_: list[str] = SET,
        seq_len: int = typer.Option(2048), batch: int = typer.Option(1),
        dtype: str = typer.Option("float32"),
        grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt"),
        device: str = typer.Option("cpu"), backend: str = typer.Option(None),
        steps: int = typer.Option(2), stall_timeout: float = typer.Option(60.0),
        budget: float = typer.Option(600.0), memory_cap_mb: int = typer.Option(None),
        seed: int = typer.Option(0), out: Path = typer.Option(None)):
    """The layer sweep with only BRANCH computed, beside all three branches."""
    counts = _layer_counts(layers)
    base = _base_spec(target, set_, seq_len, batch, dtype, grad_ckpt, device, backend, steps,
                      stall_timeout, budget, memory_cap_mb, seed)
    run_dir = out or default_run_dir("isolate-branch")
    raise typer.Exit(_print_report(_run(isolate_branch, base, branch, counts, run_dir,
                                        _argv(), total=2 * len(counts))))


class _TriageFollow(_Follow):
    """The sweep's progress bar, plus a line per triage stage and per trial."""

    def callbacks(self) -> TriageCallbacks:
        return TriageCallbacks(on_trial=self.on_trial, on_events=self.on_events,
                               on_record=self.on_record, on_stage=self.on_stage)

    def on_stage(self, stage: str) -> None:
        self.progress.console.print(f"[bold]{stage}[/bold]")


@app.command("triage")
def triage_cmd(
        target: str = TARGET, set_: list[str] = SET,
        max_layers: int = typer.Option(8, help="Deepest layer count the sweep may try."),
        max_minutes: float = typer.Option(10.0, help="Wall-clock limit of the whole triage."),
        seq_len: int = typer.Option(2048), batch: int = typer.Option(1),
        dtype: str = typer.Option("float32"),
        grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt"),
        device: str = typer.Option("cpu"), backend: str = typer.Option(None),
        steps: int = typer.Option(2), stall_timeout: float = typer.Option(60.0),
        budget: float = typer.Option(600.0, help="Seconds per trial at most (the time "
                                                  "limit may plan less)."),
        memory_cap_mb: int = typer.Option(None), seed: int = typer.Option(0),
        world_size: int = typer.Option(1, "--world-size", help="Processes per trial; above "
                                       "1 each trial runs under torchrun (nsadiag ddp)."),
        ddp_backend: str = typer.Option("gloo", help="gloo (CPU) or nccl, with --world-size."),
        checks: bool = typer.Option(True, "--checks/--no-checks",
                                    help="Correctness checks before the sweep."),
        isolate: bool = typer.Option(True, "--isolate/--no-isolate",
                                     help="Branch isolation on a failure."),
        bisect: bool = typer.Option(True, "--bisect/--no-bisect",
                                    help="Knob bisection on a failure."),
        ci: bool = typer.Option(False, "--ci", help="Also append the report to "
                                "$GITHUB_STEP_SUMMARY; plain output."),
        baseline: Path = typer.Option(None, help="summary.json (or run directory) to compare "
                                      "step time and peak memory with; exit 3 on a "
                                      "regression."),
        regression_threshold: float = typer.Option(0.2, help="Relative slowdown or growth "
                                                   "that counts as a regression."),
        no_redact: bool = typer.Option(False, "--no-redact",
                                       help="Keep host names, IPs and user names."),
        out: Path = typer.Option(None, help="Run directory.")):
    """Env doctor, layer threshold, repeats, branch isolation and knob bisection to a
    minimal failing configuration; report. Exit 0 healthy, 1 failure, 2 usage, 3 regression."""
    base = _base_spec(target, set_, seq_len, batch, dtype, grad_ckpt, device, backend, steps,
                      stall_timeout, budget, memory_cap_mb, seed)
    options = TriageOptions(max_layers=max_layers, max_minutes=max_minutes, checks=checks,
                            isolate=isolate, bisect=bisect, world_size=world_size,
                            ddp_backend=ddp_backend, no_redact=no_redact)
    run_dir = out or default_run_dir("triage")
    args = (base, options, run_dir, _argv())
    extra = dict(baseline=baseline, regression_threshold=regression_threshold, ci=ci)
    try:
        if ci:
            outcome = triage(*args, callbacks=_plain_callbacks(), **extra)
        else:
            columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
            with Progress(*columns, console=console, transient=True) as progress:
                outcome = triage(*args, callbacks=_TriageFollow(progress, None).callbacks(),
                                 **extra)
    except ValueError as err:
        fail(str(err))
    except KeyboardInterrupt:
        print(f"nsadiag: interrupted: children killed; finished trials are kept in "
              f"{run_dir}/trials.jsonl; rerun with --out {run_dir} to resume", file=sys.stderr)
        raise typer.Exit(130) from None
    _print_report(outcome.report)
    if outcome.step_summary:
        console.print(f"step summary appended to {outcome.step_summary}")
    raise typer.Exit(outcome.exit_code)


def _plain_callbacks() -> TriageCallbacks:
    """One plain line per stage and per finished trial (CI logs have no live display)."""
    def on_record(record: TrialRecord) -> None:
        print(f"  {record.spec.get('n_layers')} layers  {record.verdict_name}  "
              f"{record.wall_s:.1f} s  {Path(record.trial_dir).name}", flush=True)

    return TriageCallbacks(on_stage=lambda stage: print(f"triage: {stage}", flush=True),
                           on_record=on_record)


@app.command("compare")
def compare_cmd(before: Path = typer.Argument(..., help="Run directory or summary.json."),
                after: Path = typer.Argument(..., help="Run directory or summary.json."),
                threshold: float = typer.Option(0.2, help="Relative growth that counts as a "
                                                "regression."),
                as_json: bool = typer.Option(False, "--json"),
                force: bool = typer.Option(False, "--force", help="Compare runs whose "
                                           "configurations differ.")):
    """Diff two runs' summary.json: verdict changes, step time and peak memory; exit 3 on a
    regression (a change above the threshold and above the runs' measured spread)."""
    try:
        result = compare_runs(before, after, threshold, force)
    except ValueError as err:
        fail(str(err))
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        for change in result["verdict_changes"]:
            console.print(f"{change['label'] or '-'} {change['n_layers']} layers: "
                          f"{change['before']} -> {change['after']}")
        for difference in result["config_differences"]:
            console.print(f"configurations differ (forced): {difference}")
        table = Table("run", "layers", "quantity", "before", "after", "change", "noise")
        for d in result["deltas"]:
            style = "red" if d["regressed"] else "green"
            noise = f"±{d['noise']:.0%}" if d.get("noise") is not None else "-"
            if d.get("explained"):
                noise += f"; vs expected cost {d['cost_change']:+.0%}: the machine"
            table.add_row(d["label"] or "-", str(d["n_layers"]), d["quantity"],
                          f"{d['before']:.4g}", f"{d['after']:.4g}",
                          f"[{style}]{d['change']:+.0%}[/{style}]", noise)
        console.print(table)
        console.print(f"{len(result['regressions'])} regression(s) above "
                      f"+{100 * threshold:.0f}%")
    raise typer.Exit(EXIT_REGRESSION if result["regressions"] else 0)


@app.command("ddp")
def ddp_cmd(
        world_size: int = typer.Option(2, "--world-size", help="Ranks (processes)."),
        backend: str = typer.Option("gloo", help="gloo (CPU) or nccl (one GPU per rank)."),
        layers: int = typer.Option(None, help="Number of layers."),
        target: str = TARGET, set_: list[str] = SET,
        seq_len: int = typer.Option(256, help="Tokens per sequence."),
        batch: int = typer.Option(1, help="Rows per rank."),
        dtype: str = typer.Option("float32"),
        grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt"),
        device: str = typer.Option(None, help="cpu or cuda; default cuda for nccl, else cpu."),
        steps: int = typer.Option(2, help="Training steps."),
        stall_timeout: float = typer.Option(30.0, help="Seconds without a heartbeat."),
        budget: float = typer.Option(600.0, help="Seconds for the whole trial."),
        pg_timeout: float = typer.Option(None, help="Process-group timeout in seconds; "
                                                   "default 2 x stall timeout + 60."),
        seed: int = typer.Option(0), out: Path = typer.Option(None, help="Run directory.")):
    """One trial under torchrun: per-rank heartbeats and collectives, who waits where."""
    device = device or ("cuda" if backend == "nccl" else "cpu")
    base = _base_spec(target, set_, seq_len, batch, dtype, grad_ckpt, device, None, steps,
                      stall_timeout, budget, None, seed)
    try:
        base = base.replace(n_layers=layers)
    except ValueError as err:
        fail(str(err))
    run_dir = out or default_run_dir("ddp")
    with console.status(f"{world_size} ranks ({backend}) running"):
        try:
            report = ddp_command(base, world_size, backend, run_dir, _argv(),
                                 pg_timeout_s=pg_timeout)
        except ValueError as err:
            fail(str(err))
    raise typer.Exit(_print_report(report))


def _in_process_spec(target, overrides, layers, seq_len, batch, dtype, grad_ckpt, device,
                     backend, steps) -> TrialSpec:
    """The spec of a command that runs the target in this process (no watchdog limits)."""
    base = _base_spec(target, overrides, seq_len, batch, dtype, grad_ckpt, device, backend,
                      steps, 60.0, 600.0, None, 0)
    try:
        spec = base.replace(n_layers=layers)
        check_target(spec)
    except ValueError as err:
        fail(str(err))
    return spec


def _in_process(command, spec: TrialSpec, *args):
    """Run an in-process command; its ValueError/RuntimeError is one line, exit 2."""
    try:
        return command(spec, *args)
    except (ValueError, RuntimeError) as err:
        fail(str(err).splitlines()[0])


@app.command("memory")
def memory_cmd(target: str = TARGET, set_: list[str] = SET,
               layers: int = typer.Option(None, help="Number of layers."),
               seq_len: int = typer.Option(2048), batch: int = typer.Option(1),
               dtype: str = typer.Option("float32"),
               grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt"),
               device: str = typer.Option("cpu"), backend: str = typer.Option(None),
               steps: int = typer.Option(2), top: int = typer.Option(10),
               out: Path = typer.Option(None, help="Run directory (memory.json, "
                                        "snapshot.pickle on CUDA)."),
               ab_expandable_segments: bool = typer.Option(
                   False, "--ab-expandable-segments",
                   help="Measure again in children without and with expandable segments."),
               as_json: bool = typer.Option(False, "--json")):
    """Bytes saved for backward per module, branch and layer, peak memory, CUDA history."""
    spec = _in_process_spec(target, set_, layers, seq_len, batch, dtype, grad_ckpt, device,
                            backend, steps)
    if ab_expandable_segments:
        _in_process(require_cuda, spec)
    run_dir = out or default_run_dir("memory")
    summary = _in_process(lambda s: memory_command(s, prepare_run_dir(run_dir), top), spec)
    if ab_expandable_segments:
        summary["ab_expandable_segments"] = _in_process(ab_compare, spec, run_dir, top)
    if as_json:
        print(json.dumps(summary, indent=1))
        return
    _print_memory(summary, top)


def _print_memory(summary: dict, top: int) -> None:
    console.print(f"saved for backward by the first forward: {_mib(summary['saved_total'])}")
    table = Table("module", "saved")
    for name, size in list(summary["saved_by_module"].items())[:top]:
        table.add_row(name, _mib(size))
    console.print(table)
    if summary["saved_by_branch"]:
        console.print("by NSA branch: " + ", ".join(
            f"{b} {_mib(n)}" for b, n in summary["saved_by_branch"].items()))
    layers = Table("layer", "saved for backward", "CUDA allocated delta")
    for row in summary["per_layer"]:
        style = "bold red" if row["layer"] in summary["layer_standouts"] else None
        delta = "-" if row["cuda_delta"] is None else _mib(row["cuda_delta"])
        layers.add_row(row["layer"], _mib(row["saved"]), delta, style=style)
    console.print(layers)
    for name in summary["layer_standouts"]:
        console.print(f"[bold red]stands out:[/bold red] {name} saves more than 4x the "
                      f"median layer")
    largest = Table("largest saved tensors", "shape", "dtype", "size")
    for entry in summary["largest_saved"]:
        largest.add_row(entry["module"], str(entry["shape"]), entry["dtype"],
                        _mib(entry["nbytes"]))
    console.print(largest)
    console.print(f"peak RSS: {_mib(summary['peak_rss'])}, step {summary['step_s']:.3f} s")
    cuda = summary["cuda"]
    console.print(cuda if isinstance(cuda, str) else
                  ", ".join(f"{k} {v}" for k, v in cuda.items()))
    _print_history(summary["history"])
    if isinstance(summary["gpu"], str):
        console.print(summary["gpu"])
    if "ab_expandable_segments" in summary:
        ab = Table("quantity", "default", "expandable_segments:True", "change")
        for row in summary["ab_expandable_segments"]["rows"]:
            fmt = _mib if row["unit"] == "bytes" else str
            change = "-" if row["change"] is None else f"x{row['change']:.2f}"
            ab.add_row(row["quantity"], fmt(row["baseline"]), fmt(row["expandable"]), change)
        console.print(ab)


def _print_history(history: dict) -> None:
    if "unavailable" in history:
        console.print(history["unavailable"])
        return
    found = history["summary"]
    sites = Table("allocation site (live at peak)", "bytes", "blocks")
    for site in found["top_sites"]:
        sites.add_row(site["site"], _mib(site["bytes"]), str(site["blocks"]))
    console.print(sites)
    console.print(f"segments {found['segments']}: reserved {_mib(found['reserved'])}, "
                  f"allocated {_mib(found['allocated'])}, {found['free_blocks']} free blocks, "
                  f"largest free block {_mib(found['largest_free_block'])}, fragmentation "
                  f"{found['fragmentation']:.2f}; snapshot: {history['snapshot']} "
                  f"(open in https://pytorch.org/memory_viz)")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@app.command("trace")
def trace_cmd(target: str = TARGET, set_: list[str] = SET,
              layers: int = typer.Option(None, help="Number of layers."),
              seq_len: int = typer.Option(2048), batch: int = typer.Option(1),
              dtype: str = typer.Option("float32"),
              grad_ckpt: bool = typer.Option(False, "--grad-ckpt/--no-grad-ckpt"),
              device: str = typer.Option("cpu"), backend: str = typer.Option(None),
              out: Path = typer.Option(None, help="Directory for trace.json."),
              as_json: bool = typer.Option(False, "--json")):
    """One step under autograd hooks: timeline, Perfetto trace, gradient anomalies."""
    spec = _in_process_spec(target, set_, layers, seq_len, batch, dtype, grad_ckpt, device,
                            backend, 1)
    run_dir = out or default_run_dir("trace")
    summary = _in_process(lambda s: trace_command(s, prepare_run_dir(run_dir)), spec)
    if as_json:
        print(json.dumps(summary, indent=1))
        return
    table = Table("module", "phase", "start ms", "duration ms")
    for span in summary["timeline"][:15]:
        table.add_row(span["module"], span["phase"], f"{span['start_us'] / 1000:.1f}",
                      f"{span['duration_us'] / 1000:.1f}")
    console.print(table)
    for key in ("unused_parameters", "repeated_gradients", "unfinished_backward"):
        console.print(f"{key.replace('_', ' ')}: {summary[key] or 'none'}")
    console.print(f"step {summary['step_s_untraced']:.3f} s untraced, "
                  f"{summary['step_s_traced']:.3f} s traced ({summary['overhead_pct']:+.1f}%), "
                  f"{summary['events']} events; Perfetto trace: {summary['trace_json']}")


@app.command("check")
def check_cmd(which: str = typer.Argument(..., help="causality, parity, ckpt, ddp or all."),
              target: str = TARGET, set_: list[str] = SET,
              layers: int = typer.Option(None, help="Number of layers."),
              seq_len: int = typer.Option(2048, help="Tokens per sequence, as the trial "
                                          "commands; causality also runs a second pass at a "
                                          "longer length where the budget allows."),
              batch: int = typer.Option(2),
              device: str = typer.Option("cpu"), backend: str = typer.Option(None),
              world_size: int = typer.Option(2, help="Ranks of the ddp check."),
              stall_timeout: float = typer.Option(60.0, help="Seconds without a heartbeat."),
              budget: float = typer.Option(600.0, help="Seconds per check."),
              seed: int = typer.Option(0), out: Path = typer.Option(None, help="Run directory."),
              no_redact: bool = typer.Option(False, "--no-redact"),
              as_json: bool = typer.Option(False, "--json")):
    """Correctness checks: WRONG naming the first module that differs; exit 1 on a failure."""
    if which not in (*CHECK_NAMES, "all"):
        fail(f"check: must be one of {', '.join(CHECK_NAMES)} or all, got {which!r}")
    if world_size < 2:
        fail(f"world-size: the ddp check needs at least 2 ranks, got {world_size}")
    base = _base_spec(target, set_, seq_len, batch, "float32", False, device, backend, 1,
                      stall_timeout, budget, None, seed)
    try:
        spec = base.replace(n_layers=layers)
        results, report = check_command([which], spec, out or default_run_dir("check"),
                                        _argv(), world_size, no_redact)
    except ValueError as err:
        fail(str(err).splitlines()[0])
    if as_json:
        print(json.dumps([r.to_dict() for r in results], indent=1))
    else:
        table = Table("check", "verdict", "module", "summary")
        for r in results:
            style = "green" if r.passed else "red"
            table.add_row(r.name, f"[{style}]{r.status}[/{style}]", r.module or "-",
                          r.summary)
        console.print(table)
        console.print(f"report: {report}")
    if not all(r.passed for r in results):
        raise typer.Exit(1)


@app.command("stacks")
def stacks_cmd(pid: int = typer.Argument(..., help="A process, or a launcher with --ranks."),
               ranks: bool = typer.Option(False, "--ranks",
                                          help="Sample every Python child (torchrun ranks)."),
               native: bool = typer.Option(False, "--native", help="Native frames too."),
               samples: int = typer.Option(3, help="Samples per process."),
               interval: float = typer.Option(1.0, help="Seconds between samples."),
               out: Path = typer.Option(None, help="Also write stacks.md and stacks.json."),
               as_json: bool = typer.Option(False, "--json")):
    """What a live process is doing: sampled stacks, CPU use, waiting or busy."""
    try:
        if out is not None:
            prepare_run_dir(out)
        summary = stacks_command(pid, ranks, samples, interval, native)
    except ValueError as err:
        fail(str(err))
    if out is not None:
        write_stacks_report(summary, out)
    if as_json:
        print(json.dumps(summary, indent=1))
        return
    table = Table("pid", "rank", "state", "CPU", "innermost frames")
    for proc in summary["processes"]:
        cpu = "-" if proc["cpu_fraction"] is None else f"{100 * proc['cpu_fraction']:.0f}%"
        table.add_row(str(proc["pid"]), str(proc["rank"] if proc["rank"] is not None else "-"),
                      proc["state"], cpu, proc["signature"] or "; ".join(proc["unavailable"]))
    console.print(table)
    for pid_odd in summary["odd_ones_out"]:
        console.print(f"[bold red]odd one out:[/bold red] pid {pid_odd} differs from the rest")


@app.command("report")
def report_cmd(run_dir: Path = typer.Argument(..., help="A run directory."),
               no_redact: bool = typer.Option(False, "--no-redact",
                                              help="Keep host names, IPs and user names.")):
    """Re-render report.md and summary.json of RUN_DIR from its stored trials."""
    if not run_dir.is_dir():
        fail(f"run_dir: {run_dir} is not a directory")
    try:
        _print_report(render_run(run_dir, no_redact=no_redact))
    except ValueError as err:
        fail(str(err))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # so a cancelled job unwinds through the runners' kill paths


def main() -> None:
    # CI cancellation and `timeout` send SIGTERM: without this Python would die on the spot
    # and leave trial children and torchrun ranks (in their own sessions) running
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    app()


if __name__ == "__main__":
    main()
