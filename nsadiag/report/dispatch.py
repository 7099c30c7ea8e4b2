"""Which report a run directory gets, rendered from what it stored.

Every run directory names its kind in run.json (``command_name``): sweep-layers and
isolate-branch (nsadiag.report.sweep, from trials.jsonl), sweep-seq (.seq), ddp (.ddp),
check (.check, from checks.json), triage (.triage, from triage.json and trials.jsonl),
memory (.memory, from memory.json), trace (.trace, from trace-result.json), stacks
(.stacks, from stacks.json), run and watch (.run, from record.json) and attach (.attach,
from attach.json). Directories written before
run.json named every kind are recognised by their files.

``render_run(run_dir)`` writes report.md and summary.json (and the kind's plots) and is
what `nsadiag report DIR` and every command end with; `nsadiag run` and nsadiag.watch()
end with ``render_record``, from the record they hold. Both files are redacted
(nsadiag.redact) unless ``no_redact``, except for the hosts the job's ranks are named by
(``job_hosts``): a report on the job's machines names them. A record line of trials.jsonl
that is torn or malformed is skipped and listed at the end of report.md and in summary.json's
``skipped_records``.

A stored record is parsed where it is read (nsadiag.rundir.parse_stored): trials.jsonl
lines and record.json against the trial schema (their spec a RecordSpec), run.json into a
RunMeta, triage.json and checks.json into their typed state, attach.json, memory.json,
trace-result.json and stacks.json into theirs (AttachRecord, MemoryRecord, TraceResult,
StacksRecord). One that does not parse is one RecordError line; the renderers get typed
records only, so a KeyError or TypeError while rendering is a fault of nsadiag and is
not taken for a malformed file. A run's record.json carries its Finding (decided once,
when the record was made): the renderer lays it out. A sweep, a ddp job and a triage keep
theirs in finding.json (decided as the command ended; a sweep's and a triage's with the
machine memory their cliff was predicted against), check, memory, trace, attach and
stacks in checks.json, memory.json, trace-result.json, attach.json and stacks.json. One
written before findings were stored has its finding decided where it is loaded
(``decided_late``), the one place that does; `nsadiag run` and nsadiag.watch() hand their
record over (``render_record``) instead of reading it back.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsadiag import runfiles
from nsadiag.findingdata import Finding
from nsadiag.memoryrecord import MemoryRecord
from nsadiag.recordspec import RecordSpec
from nsadiag.redact import Redactor
from nsadiag.report.skeleton import Section
from nsadiag.report.summary import KINDS
from nsadiag.rundir import (
    FINDING_FILE,
    RecordError,
    TrialRecord,
    give_back_reserve,
    kept_finding_file,
    load_records,
    locked,
    parse_stored,
    read_json,
    stored_finding,
    stored_redaction,
    write_json,
    write_text,
)
from nsadiag.runmeta import RunMeta
from nsadiag.stacksrecord import StacksRecord
from nsadiag.store.owned import check_run_dir
from nsadiag.textsafe import clean, clean_obj, markdown_safe
from nsadiag.traceresult import TraceResult

if TYPE_CHECKING:
    from nsadiag.checks import CheckResult
    from nsadiag.triage.state import TriageState

PLOTS = ("sweep.png", "memory.png", "flame.png", "process-memory.png")
RANKED_KINDS = ("ddp", "run", "watch")
"""Kinds whose summary names the job's hosts (``hosts``: nsadiag.report.ranks)."""
LOCK_WAIT_S = 10.0
"""How long a render waits while another nsadiag holds the run directory."""


@dataclass
class Rendered:
    """What rendering wrote: report.md, summary.json (its path and content, as written),
    the plots and raw files worth naming; the run's headline and the exit code it stands
    for."""

    report: Path
    summary_path: Path
    summary: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    """The job's hosts its ranks are named by (shown, not redacted: nsadiag.redact)."""

    @property
    def headline(self) -> str:
        return self.summary["headline"]

    @property
    def exit_code(self) -> int:
        return self.summary["exit_code"]


def stored_meta(run_dir: Path) -> dict[str, Any]:
    """run.json of a run directory as stored ({} when there is none); RecordError (one
    line) when it is not an object."""
    path = run_dir / "run.json"
    meta = read_json(path, "run.json") if path.exists() else {}
    if not isinstance(meta, dict):
        raise RecordError(f"run.json: {path} is not a JSON object")
    return meta


def read_meta(run_dir: Path) -> RunMeta:
    """run.json of a run directory, parsed (nsadiag.runmeta); RecordError (one line) when
    it is not an object or a field the renderers read has the wrong type."""
    return RunMeta.from_dict(stored_meta(run_dir))


def run_kind(run_dir: Path, meta: RunMeta) -> str:
    """The run's kind: run.json's command_name, else what its files say."""
    kind = meta.command_name
    if kind is None:
        for name, guess in (("triage.json", "triage"), ("record.json", "run"),
                            ("attach.json", "attach"),
                            ("checks.json", "check"), ("memory.json", "memory"),
                            ("trace-result.json", "trace"), ("stacks.json", "stacks"),
                            ("trials.jsonl", "sweep-layers")):
            if (run_dir / name).exists():
                return guess
        raise ValueError(f"run_dir: {run_dir} holds no nsadiag run (no run.json, "
                         f"trials.jsonl or triage.json)")
    if kind not in KINDS:
        raise ValueError(f"run.json: command_name must be one of {', '.join(KINDS)}, got "
                         f"{kind!r}")
    return kind


def _records(run_dir: Path, skipped: list[str]) -> list[TrialRecord]:
    records = load_records(run_dir / "trials.jsonl", skipped)
    if not records:
        raise ValueError(f"run_dir: no trials.jsonl with finished trials in {run_dir}")
    return records


def located(record: TrialRecord, run_dir: Path) -> TrialRecord:
    """A run's record.json with its trial directory where it lies: the directory holding
    it (the record names the path it was written at; a run directory moved or received
    lies elsewhere, and a planted one may name "/")."""
    named = Path(record.trial_dir)
    if named.is_absolute() and not named.resolve().is_relative_to(run_dir.resolve()):
        runfiles.note(f"record.json names its directory {str(named)[:200]!r}: read as "
                      f"this directory")
    record.trial_dir = str(run_dir)
    return record


def stored_record(run_dir: Path) -> TrialRecord:
    """record.json of a run or watch directory, parsed (RecordError, one line, when it is
    malformed, its stored finding included) and located in ``run_dir``; a record written
    before findings were stored gets its finding here (``decided_late``)."""
    if not os.path.lexists(run_dir / "record.json"):
        kept = [name for name in ("stdout.txt", "stderr.txt") if (run_dir / name).exists()]
        output = f"; the command's output so far is in {' and '.join(kept)}" if kept else ""
        raise ValueError(f"report: the run in {run_dir} never got its verdict: the nsadiag "
                         f"watching it ended before it wrote record.json (killed, or the "
                         f"machine went down){output}; run the command again")
    record = located(parse_stored("record.json", TrialRecord.from_dict,
                                  read_json(run_dir / "record.json", "record.json")), run_dir)
    if record.finding is None:
        from nsadiag.finding.run import run_finding

        record = replace(record, finding=decided_late(lambda: run_finding(record)))
    return record


def kept_or_decided(stored: Any, what: str, decide: Callable[[], Finding]) -> Finding:
    """The finding a stored JSON object keeps under ``finding`` (checked against its schema:
    RecordError, one line, naming ``what``), or for one written before findings were
    stored, the one ``decide`` gives (``decided_late``)."""
    kept = stored_finding(stored.get("finding") if isinstance(stored, dict) else None,
                          f"{what}: a stored record is malformed")
    return kept if kept is not None else decided_late(decide)


def decided_late(decide: Callable[[], Finding]) -> Finding:
    """The one place a report decides a finding: for a record written before findings were
    stored with the record (by an older nsadiag), the finding its command would have
    stored, decided as it is loaded. Every other finding is laid out as it was kept."""
    return decide()


def record_finding(record: TrialRecord) -> Finding:
    """The finding a run's record carries; ValueError for one that carries none (a record
    handed over must have been given its finding where it was made)."""
    if record.finding is None:
        raise ValueError("record: carries no finding (nsadiag.finding.run.with_finding "
                         "gives it one where the record is made)")
    return record.finding


def build(run_dir: Path, kind: str, meta: RunMeta, skipped: list[str]
          ) -> tuple[str, dict[str, Any]]:
    """(markdown, summary.json) of a run directory of ``kind``, unredacted."""
    if kind in ("sweep-layers", "isolate-branch", "sweep-seq"):
        return _sweep(run_dir, kind, meta, skipped)
    if kind == "ddp":
        from nsadiag.finding.ddp import ddp_finding
        from nsadiag.report.ddp import build_ddp_report

        records = _records(run_dir, skipped)
        finding = kept_or_decided(kept_finding_file(run_dir), FINDING_FILE,
                                  lambda: ddp_finding(records[-1]))
        return build_ddp_report(records, meta, finding)
    if kind == "triage":
        from nsadiag.report.triage import build_triage_report
        from nsadiag.triage.finding import (
            measure_triage,
            stored_trials,
            triage_finding,
            triage_result,
        )

        state = parse_stored("triage.json", triage_state,
                             read_json(run_dir / "triage.json", "triage.json"))
        trials = stored_trials(run_dir)
        kept = kept_finding_file(run_dir)
        measured = measure_triage(state, trials, kept_memory(kept))
        finding = kept_or_decided(kept, FINDING_FILE, lambda: triage_finding(
            state, trials, measured))
        return build_triage_report(run_dir, state, trials, triage_result(measured, finding))
    if kind == "attach":
        from nsadiag.finding.attach import AttachRecord, attach_finding
        from nsadiag.report.attach import build_attach_report

        stored = read_json(run_dir / "attach.json", "attach.json")
        attached = parse_stored("attach.json", AttachRecord.from_dict, stored)
        attach_meta = meta.attached()
        finding = kept_or_decided(stored, "attach.json", lambda: attach_finding(
            attached, attach_meta))
        return build_attach_report(attached, attach_meta, finding)
    if kind in ("run", "watch"):
        from nsadiag.report.run import build_run_report

        record = stored_record(run_dir)
        return build_run_report(record, record_finding(record), run_dir)
    if kind == "check":
        from nsadiag.finding.check import check_finding
        from nsadiag.report.check import build_check_report

        stored = read_json(run_dir / "checks.json", "checks.json")
        results, spec, world_size = parse_stored("checks.json", checks, stored)
        finding = kept_or_decided(stored, "checks.json", lambda: check_finding(
            results, spec, shlex.join(meta.argv) if meta.argv else None))
        return build_check_report(results, spec, list(meta.argv), world_size, finding)
    if kind == "memory":
        from nsadiag.finding.measured import memory_finding
        from nsadiag.report.memory import build_memory_report

        stored = read_json(run_dir / "memory.json", "memory.json")
        measured = parse_stored("memory.json", MemoryRecord.from_dict, stored)
        finding = kept_or_decided(stored, "memory.json", lambda: memory_finding(
            measured, meta.spec or RecordSpec()))
        return build_memory_report(run_dir, measured, meta, finding)
    if kind == "trace":
        from nsadiag.finding.measured import trace_finding
        from nsadiag.report.trace import build_trace_report

        stored = read_json(run_dir / "trace-result.json", "trace-result.json")
        result = parse_stored("trace-result.json", TraceResult.from_dict, stored)
        finding = kept_or_decided(stored, "trace-result.json", lambda: trace_finding(
            result, meta.spec or RecordSpec()))
        return build_trace_report(run_dir, result, meta, finding)
    from nsadiag.finding.measured import stacks_finding
    from nsadiag.report.stacks import build_stacks_report, process_view

    stored = read_json(run_dir / "stacks.json", "stacks.json")
    sampled = parse_stored("stacks.json", StacksRecord.from_dict, stored)
    finding = kept_or_decided(stored, "stacks.json", lambda: stacks_finding(
        [process_view(p) for p in sampled.processes], list(sampled.odd_ones_out)))
    return build_stacks_report(sampled, meta, finding)


def _sweep(run_dir: Path, kind: str, meta: RunMeta, skipped: list[str]
           ) -> tuple[str, dict[str, Any]]:
    """A sweep's report: its trials' measurements, against the machine memory its kept
    finding (finding.json) was decided with, and that finding; a sweep that kept none (an
    older nsadiag, or one that did not end) has it decided here (``decided_late``), against
    this machine's memory."""
    import psutil

    from nsadiag.finding.sweep import decide_sweep, measure_sweep

    records = _records(run_dir, skipped)
    kept = kept_finding_file(run_dir)
    memory = kept_memory(kept) or psutil.virtual_memory().total
    measured = measure_sweep(kind, records, meta, memory)
    finding = kept_or_decided(kept, FINDING_FILE, lambda: decide_sweep(measured))
    if kind == "sweep-seq":
        from nsadiag.report.seq import build_seq_report

        return build_seq_report(run_dir, measured, meta, finding)
    from nsadiag.report.sweep import build_report

    return build_report(run_dir, measured, replace(meta, command_name=measured.command),
                        finding)


def kept_memory(kept: dict[str, Any] | None) -> int | None:
    """The machine memory (bytes) a kept finding (a sweep's, a triage's) was decided
    against, None when finding.json holds none; RecordError (one line) for one that is not
    a positive whole number."""
    memory = kept.get("machine_memory") if kept is not None else None
    if memory is None:
        return None
    if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
        raise RecordError(f"{FINDING_FILE}: machine_memory must be a positive number of "
                          f"bytes, got {str(memory)[:40]!r}")
    return memory


def triage_state(stored: dict[str, Any]) -> TriageState:
    """triage.json as its typed state (its check results, confidence and base spec
    parsed with it)."""
    from nsadiag.triage.state import TriageState

    return TriageState.from_dict(stored)


def checks(stored: dict[str, Any]) -> tuple[list[CheckResult], RecordSpec, int]:
    """checks.json as (its results, the spec they ran with, the DDP world size)."""
    from nsadiag.checks import CheckResult

    return ([CheckResult.from_dict(c) for c in stored["results"]],
            RecordSpec.from_dict(stored["spec"]), int(stored["world_size"]))


def build_confined(run_dir: Path, kind: str, meta: RunMeta, skipped: list[str]
                   ) -> tuple[str, dict[str, Any], list[str]]:
    """``build`` reading no file a record names outside ``run_dir`` (nsadiag.runfiles), and
    the lines saying what it did not read."""
    with runfiles.rendering(run_dir) as not_read:
        text, summary = build(run_dir, kind, meta, skipped)
    return text, summary, not_read


def render_locked(run_dir: Path, no_redact: bool = False) -> Rendered:
    """``render_run`` holding the run directory's lock (`nsadiag report`): waits up to
    LOCK_WAIT_S while another nsadiag holds it, then ValueError (one line) naming it."""
    check_run_dir(run_dir)  # before the lock: nothing is written into anything else
    with locked(run_dir, LOCK_WAIT_S):
        return render_run(run_dir, no_redact)


def render_run(run_dir: Path, no_redact: bool = False) -> Rendered:
    """Write the run directory's report.md and summary.json (redacted unless
    ``no_redact``, with what the run recorded to hide) from its stored records; ValueError
    (one line) for a directory that holds no run or a malformed record. The caller holds
    the directory (the command that ran it, or ``render_locked``); once the report is
    written, the disk reserve of the run (nsadiag.rundir) is given back."""
    if not run_dir.is_dir():
        raise ValueError(f"run_dir: {run_dir} is not a directory")
    meta = read_meta(run_dir)
    kind = run_kind(run_dir, meta)
    skipped: list[str] = []
    # every record was parsed where it was read (RecordError there): a KeyError while
    # rendering one is a fault of the renderer, not of the file, and goes up as itself
    try:
        text, summary, not_read = build_confined(run_dir, kind, meta, skipped)
    except RecursionError:
        raise ValueError(f"report: a stored record of {run_dir} nests too deeply to "
                         f"read") from None
    return _write(run_dir, kind, text, summary, skipped, not_read, no_redact)


def render_record(record: TrialRecord, run_dir: Path, no_redact: bool = False) -> Rendered:
    """``render_run`` of a run or watch directory from ``record``, the record (with its
    finding) that the calling process (`nsadiag run`, nsadiag.watch()'s helper) has just
    written to record.json: nothing is read back or decided again."""
    from nsadiag.report.run import build_run_report

    if not run_dir.is_dir():
        raise ValueError(f"run_dir: {run_dir} is not a directory")
    with runfiles.rendering(run_dir) as not_read:
        text, summary = build_run_report(record, record_finding(record), run_dir)
    return _write(run_dir, "run", text, summary, [], not_read, no_redact)


def _write(run_dir: Path, kind: str, text: str, summary: dict[str, Any], skipped: list[str],
           not_read: list[str], no_redact: bool) -> Rendered:
    """report.md and summary.json as rendered, with what was skipped or not read, cleaned
    and redacted; then the run's disk reserve is given back."""
    if skipped:
        text += Section("Records skipped", [f"- {s}" for s in skipped]).markdown()
        summary["skipped_records"] = skipped
    if not_read:
        text += Section("Files not read", [
            "What a record names is read only from inside this directory, as a regular file "
            "of a bounded size; here it was not:", "", *(f"- {line}" for line in not_read)
        ]).markdown()
        summary["files_not_read"] = not_read
    # what a record holds is shown, never obeyed: no escape sequence reaches a terminal
    # that shows report.md or summary.json (nsadiag.textsafe)
    text, summary = markdown_safe(clean(text)), clean_obj(summary)
    hosts = job_hosts(kind, summary)
    if not no_redact:
        redactor = Redactor.with_recorded(stored_redaction(run_dir), {h: h for h in hosts})
        text, summary = redactor.text(text), redactor.obj(summary)
    report = write_text(run_dir / "report.md", text)
    written = write_json(run_dir / "summary.json", summary)
    plots = [run_dir / name for name in PLOTS if (run_dir / name).exists()]
    give_back_reserve(run_dir)
    return Rendered(report, written, summary, [report, written, *plots], hosts)


def job_hosts(kind: str, summary: dict[str, Any]) -> list[str]:
    """The hosts a job's ranks are named by (summary.json's ``hosts`` of a ddp, run or watch
    run; none for the other kinds): its report shows them, a bundle gives each a
    pseudonym (nsadiag.redact)."""
    named = summary.get("hosts") if kind in RANKED_KINDS else None
    return [h for h in named if isinstance(h, str) and h] if isinstance(named, list) else []

