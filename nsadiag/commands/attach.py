"""nsadiag attach PID: a live process (or every rank of a torchrun job) watched for a
window without restarting, pausing for long, or killing it: progressing, stuck (busy or
idle), or waiting in a collective.

``attach_command(pid, duration_s, ranks, run_dir, argv)`` checks its arguments, finds the
processes (PID, or with ``ranks`` the ranks under PID: torchrun or its agent, their RANK,
found as ``nsadiag stacks --ranks`` finds them), samples them all over ``duration_s``
seconds (nsadiag.harness.window: stack samples, CPU time, native samples of a frozen line,
the heartbeat a process nsadiag already watches wrote meanwhile) and writes the run
directory. What each process and the job read as is nsadiag.verdict.window's.

The run directory gets run.json, attach.json (every observation, samples included, and the
finding decided from them once, nsadiag.finding.attach), report.md and summary.json
(redacted unless ``no_redact``); the exit code follows the verdict as for every command
(nsadiag.ci).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from nsadiag.envinfo import ptrace_permission
from nsadiag.finding.attach import AttachRecord, attach_finding
from nsadiag.harness.window import SAMPLES, WindowObservation, sample_all
from nsadiag.processes import can_attach, check_python, rank_processes
from nsadiag.ranknames import process_names
from nsadiag.report.dispatch import Rendered, render_run
from nsadiag.rundir import prepare_run_dir, write_json, write_run_meta
from nsadiag.runmeta import RunMeta
from nsadiag.sourcelines import capture
from nsadiag.verdict.names import Verdict
from nsadiag.verdict.window import state_of

MIN_DURATION_S = 1.0


def targets_of(pid: int, ranks: bool) -> list[tuple[int, int | None]]:
    """(pid, rank) of the processes to observe: PID, or the ranks under it; ValueError
    (one line) for a process that is missing or cannot be sampled."""
    if not psutil.pid_exists(pid):
        raise ValueError(f"pid: no process {pid}")
    targets = rank_processes(pid) if ranks else [(pid, None)]
    if ranks and any(rank is not None for _, rank in targets):
        targets = [(p, r) for p, r in targets if r is not None]
    permission = ptrace_permission()
    for target, _ in targets:
        _check_python(target)
        can_attach(target, permission)
    return targets


def _check_python(pid: int) -> None:
    """ValueError (one line) when ``pid`` is known not to run Python: neither its program
    nor its command's first word is an interpreter, and no libpython is mapped into it (a
    program that embeds Python). Each is read where it can be (a program whose executable
    link cannot be read still has a command line and a memory map); a process whose memory
    map cannot be read passes: py-spy says what it finds."""
    check_python(pid, "attach watches Python programs (give the PID of the python process)")


def attach(pid: int, duration_s: float, ranks: bool = False, samples: int = SAMPLES
           ) -> tuple[Verdict, list[WindowObservation]]:
    """Observe PID (or the ranks under it) for `duration_s`, all at once; the verdict and
    the observations. ValueError (one line) for a bad duration or what cannot be attached
    to."""
    _check_duration(duration_s)
    return sample_all(targets_of(pid, ranks), duration_s, samples)


def _check_duration(duration_s: float) -> None:
    if not duration_s >= MIN_DURATION_S:
        raise ValueError(f"duration: must be >= {MIN_DURATION_S:g} seconds, got "
                         f"{duration_s:g}")


def attach_command(pid: int, duration_s: float, ranks: bool, run_dir: Path,
                   argv: Sequence[str], no_redact: bool = False,
                   on_start: Callable[[str], None] | None = None) -> Rendered:
    """``nsadiag attach``: check, attach, then write the run directory (see the module
    docstring); returns what the report wrote. Nothing is written when a check fails;
    ``on_start`` hears what is watched once the checks passed."""
    _check_duration(duration_s)
    targets = targets_of(pid, ranks)
    prepare_run_dir(run_dir)
    if on_start:
        on_start(f"sampling {len(targets)} process(es) for {duration_s:g} s")
    meta = {"pid": pid, "duration_s": duration_s, "ranks": ranks}
    write_run_meta(run_dir, "attach", list(argv), **meta)
    # each rank's names from the environment its launcher gave it, read before the
    # window (a rank may end during it)
    names = {target: process_names(target).to_dict() for target, _ in targets} \
        if ranks else {}
    verdict, observations = sample_all(targets, duration_s)
    stored = {"verdict": verdict.to_dict(), "state": state_of(verdict.name),
              "processes": [{**o.to_dict(), **({"names": names[o.pid]} if o.pid in names
                                                else {})} for o in observations]}
    stored["source"] = capture(stored)  # this machine's code of the lines it names
    stored["finding"] = attach_finding(AttachRecord.from_dict(stored), RunMeta.from_dict(
        {"command_name": "attach", "argv": list(argv), **meta})).to_dict()
    write_json(run_dir / "attach.json", stored)
    return render_run(run_dir, no_redact)
