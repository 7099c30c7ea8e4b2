"""Markdown building blocks every report shares: numbers, tables, evidence, reproduction.

Everything here is pure formatting of stored records and rows (no file is read): units
(nsadiag.fmt), tables from pandas DataFrames (``md_table``), a trial's evidence (verdict
reasons, stall facts, last heartbeat events, the last stack sample, the traceback's tail),
and the command that reproduces a failing trial.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsadiag.envinfo import EnvReport
from nsadiag.evidence import StackFrame, StallEvidence
from nsadiag.finding.commands import cli_value
from nsadiag.finding.numbers import cost_ratio
from nsadiag.fmt import bytes_cell, seconds_cell, sig
from nsadiag.probes.frames import threads_that_matter
from nsadiag.probes.gpu import GpuUnavailable, gpu_json
from nsadiag.probes.profile import tables as profile_tables
from nsadiag.rundir import TrialRecord

if TYPE_CHECKING:
    import pandas as pd

BRANCH_COLUMNS = ("cmp", "sel", "win")


def cell(value: Any) -> str:
    """One table cell: "-" for nothing, floats to 3 significant digits, pipes escaped."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        value = ", ".join(map(str, value))
    if isinstance(value, dict):
        value = ", ".join(f"{k}={cli_value(v)}" for k, v in value.items()) or "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def md_table(frame: pd.DataFrame, formats: Mapping[str, Callable[[Any], str]] | None = None,
             limit: int | None = None) -> list[str]:
    """A Markdown table of a DataFrame's columns (header = column names); ``formats``
    maps a column to its cell formatter, the others go through ``cell``. With ``limit``,
    rows past it are counted in a last line."""
    formats = formats or {}
    if frame.empty:
        return ["No rows."]
    shown = frame if limit is None else frame.head(limit)
    columns = [str(c) for c in shown.columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in shown.itertuples(index=False, name=None):
        lines.append("| " + " | ".join(formats.get(c, cell)(v) if not _missing(v) else "-"
                                       for c, v in zip(columns, row, strict=True)) + " |")
    if limit is not None and len(frame) > limit:
        lines.append(f"\n({len(frame) - limit} more rows in summary.json)")
    return lines


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def dict_table(rows: Sequence[Mapping[str, Any]], limit: int = 40) -> list[str]:
    """A Markdown table of dict rows (the columns are the first row's keys)."""
    import pandas as pd

    if not rows:
        return ["No table."]
    return md_table(pd.DataFrame(list(rows), columns=list(rows[0])), limit=limit)


def rows_frame(rows: Sequence[Any]) -> pd.DataFrame:
    """SweepRows (or their dicts) as a DataFrame, one column per field, the per-branch
    saved bytes as saved_cmp / saved_sel / saved_win."""
    import pandas as pd

    dicts = [r if isinstance(r, Mapping) else r.to_dict() for r in rows]
    frame = pd.DataFrame(dicts)
    if frame.empty:
        return frame
    for branch in BRANCH_COLUMNS:
        frame[f"saved_{branch}"] = [(d.get("saved_by_branch") or {}).get(branch) for d in dicts]
    return frame


def results_table(rows: Sequence[Any]) -> list[str]:
    """One line per trial: times as medians over "median of" steps, the step time against
    its expected cost (the dense reference's time for its FLOPs), the peak with the bytes
    saved for backward in all and per NSA branch and the rest of the peak."""
    frame = rows_frame(rows)
    if frame.empty:
        return ["No trial finished."]
    for column in ("timed_steps", "cost_ratio", "expected_step_s", "rest_bytes", "slow_by",
                   "peak_cuda"):
        if column not in frame:
            frame[column] = None
    frame["cost_ratio"] = [cost_text(expected, ratio) for expected, ratio in
                           zip(frame["expected_step_s"], frame["cost_ratio"], strict=True)]
    cuda = frame["peak_cuda"].notna().any()  # the device's peak beside the host's
    verdict = [f"{v} (by {by})" if isinstance(by, str) else v
               for v, by in zip(frame["verdict"], frame["slow_by"], strict=True)]
    table = frame.assign(run=frame["label"].replace("", "-"), verdict=verdict)[[
        "run", "n_layers", "verdict", "forward_s", "backward_s", "step_s", "timed_steps",
        "cost_ratio", "peak_rss", *(["peak_cuda"] if cuda else []), "saved_bytes",
        *(f"saved_{b}" for b in BRANCH_COLUMNS), "rest_bytes", "steps_done"]]
    table.columns = ["run", "layers", "verdict", "forward s", "backward s", "step s",
                     "median of", "vs expected cost", "peak RSS",
                     *(["peak CUDA"] if cuda else []), "saved for backward",
                     *(f"saved {b}" for b in BRANCH_COLUMNS), "rest of the peak", "steps"]
    byte_columns = ["peak RSS", "peak CUDA", "saved for backward",
                    *(f"saved {b}" for b in BRANCH_COLUMNS), "rest of the peak"]
    formats = {**{c: seconds_cell for c in ("forward s", "backward s", "step s")},
               **{c: bytes_cell for c in byte_columns}, "layers": str, "steps": str,
               "median of": lambda n: "-" if _missing(n) else str(int(n)),
               "vs expected cost": str}
    return md_table(table, formats)


def fold_native(frames: Sequence[StackFrame]) -> list[tuple[str, int]]:
    """Frames as lines, each run of native frames folded into one line that names their
    libraries: ("3 native frames in libtorch_cpu.so, libc.so.6", 3). Python frames are
    ("function (file:line)", 1)."""
    lines: list[tuple[str, int]] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            libraries = ", ".join(dict.fromkeys(run))
            noun = "native frame" if len(run) == 1 else "native frames"
            lines.append((f"[{len(run)} {noun} in {libraries}]", len(run)))
            run.clear()

    for frame in frames:
        if frame.is_native:
            run.append(Path(frame.file or "?").name)
            continue
        flush()
        lines.append((f"{frame.function} ({Path(frame.file or '?').name}:{frame.line})", 1))
    flush()
    return lines


def cost_text(expected_s: float | None, ratio: float | None) -> str:
    """A step time against its expected cost: "33x", "too short to time" when the expected
    time is under nsadiag.finding.numbers.MIN_EXPECTED_STEP_S, "-" when unknown."""
    if _missing(ratio) or _missing(expected_s):
        return "-"
    meaningful = cost_ratio(expected_s, ratio)
    return "too short to time" if meaningful is None else f"{sig(meaningful)}x"


def stack_excerpt(stall: StallEvidence | None, limit: int = 12) -> list[str]:
    """The last stack sample of a stopped trial: the threads that matter (the main one,
    running ones, those in the user's code; nsadiag's idle sampler is none), four at most,
    innermost frame first, each run of native frames folded into one line naming its
    libraries."""
    if stall is None or not stall.samples:
        reasons = stall.unavailable if stall is not None else []
        return [f"No stack samples ({'; '.join(reasons) or 'none were needed'})."]
    lines = ["```"]
    last = stall.samples[-1]
    shown = {thread.thread_id for thread in threads_that_matter(last)}
    for thread in [t for t in last.threads if t.thread_id in shown][:4]:
        lines.append(f"thread {thread.name or thread.thread_id}"
                     f"{'' if thread.active else ' (idle)'}:")
        lines += [f"  {text}" for text, _ in fold_native(thread.frames)[:limit]]
    lines.append("```")
    return lines


def last_events(events: Sequence[Mapping[str, Any]], count: int = 8) -> list[str]:
    """The last heartbeat events, times from the first one."""
    import pandas as pd

    if not events:
        return ["No heartbeat event was written."]
    frame = pd.DataFrame(events[-count:]).reindex(
        columns=["t", "kind", "phase", "step", "module", "edge", "rss"])
    frame["t"] = frame["t"] - events[0]["t"]
    frame.columns = ["t (s)", "kind", "phase", "step", "module", "edge", "RSS"]
    return md_table(frame, {"t (s)": lambda v: f"{v:.2f}", "RSS": bytes_cell,
                            "step": lambda v: str(int(v))})


def stall_lines(stall: StallEvidence | None) -> list[str]:
    """What the stacks read as and which backward never finished, when the runner
    stopped the trial (nothing for a trial that ended by itself)."""
    if stall is None:
        return []
    samples = stall.samples
    lines = []
    if stall.stacks_class:
        note = next((s.note for s in samples if s.note), None)
        lines.append(f"- Stacks read as **{stall.stacks_class}** over {len(samples)} "
                     f"sample(s)" + (f" ({note})" if note else ""))
    unfinished = stall.unfinished_backward
    lines.append("- Backward started and never finished: " + (
        ", ".join(f"`{m}`" for m in unfinished) + " (innermost first)" if unfinished
        else "none (no module's backward was open)"))
    return lines


def stall_summary(record: TrialRecord) -> dict[str, Any] | None:
    """The stall facts of a stopped trial for summary.json, None when it ended by itself."""
    stall = record.evidence.stall if record.evidence is not None else None
    if stall is None:
        return None
    return {"stacks_class": stall.stacks_class,
            "unfinished_backward": list(stall.unfinished_backward),
            "cpu_fraction": stall.cpu_fraction(),
            "unavailable": list(stall.unavailable), "gpu": gpu_json(record.gpu)}


def evidence_section(record: TrialRecord) -> list[str]:
    """A trial's verdict and reasons, stall facts, GPU state, last events, last stack
    sample and the traceback's last lines."""
    verdict, evidence = record.verdict, record.evidence
    layers = record.spec.n_layers
    shape = f" ({layers} layers)" if layers is not None else ""
    lines = [f"Trial `{Path(record.trial_dir).name}`{shape}: **{verdict.name}**", ""]
    lines += [f"- {reason}" for reason in verdict.reasons]
    stall = evidence.stall if evidence is not None else None
    if stall is not None and stall.cpu_delta_s is not None and stall.window_s:
        lines.append(f"- CPU time over the {stall.window_s:.1f} s watch window: "
                     f"{stall.cpu_delta_s:.2f} s")
    lines += stall_lines(stall)
    profile = evidence.profile if evidence is not None else None
    if verdict.name != "OK" and profile:
        lines += [""] + profile_tables(profile) + [""]
    for missing in stall.unavailable if stall is not None else []:
        lines.append(f"- Evidence unavailable: {missing}")
    if isinstance(record.gpu, GpuUnavailable):
        lines.append(f"- {record.gpu}")
    for device in record.gpu if isinstance(record.gpu, tuple) else ():
        lines.append(f"- GPU {device.index} {device.name}: {device.util_gpu_pct}% busy, "
                     f"{bytes_cell(device.mem_used)} of {bytes_cell(device.mem_total)}, "
                     f"throttle reasons {device.throttle_reasons}")
    result = evidence.result if evidence is not None else None
    exception = (result or {}).get("exception")
    lines += ["", "Last heartbeat events:", ""] + last_events(
        evidence.events if evidence is not None else [])
    lines += ["", "Stacks (last sample):", ""] + stack_excerpt(stall)
    if exception:
        tail = exception.get("traceback", "").strip().splitlines()[-8:]
        lines += ["", "Traceback (last lines):", "", "```", *tail, "```"]
    return lines


def reproduction(command: Sequence[str] | None, failing: Sequence[str] | None) -> list[str]:
    """The command of the smallest failing trial (nsadiag.finding.commands.reproduce), or
    the run's own command when nothing failed."""
    if failing is None:
        return ["Nothing failed; the command that produced this report:", "", "```",
                shlex.join(command or []), "```"]
    return ["The smallest failing configuration of this run:", "", "```", shlex.join(failing),
            "```"]


def config_table(spec: Mapping[str, Any], keys: Sequence[str],
                 extra: Sequence[tuple[str, Any]] = ()) -> list[str]:
    """The "field | value" table of a configuration."""
    lines = ["| field | value |", "|---|---|"]
    lines += [f"| {key} | {spec_cell(key, spec.get(key))} |" for key in keys]
    lines += [f"| {name} | {value} |" for name, value in extra]
    return lines


DEFAULTS = {"branches": "all", "backend": "the target's default", "n_layers":
            "the target's default", "memory_cap_bytes": "none", "overrides": "none"}
"""What an unset spec field means, shown instead of an empty cell."""


def spec_cell(key: str, value: Any) -> str:
    """A spec field's cell: what an unset field means (DEFAULTS), never "None"."""
    if value is None or value == {} or value == []:
        return DEFAULTS.get(key, "-")
    if key == "memory_cap_bytes" and isinstance(value, int):
        return bytes_cell(value)
    return cell(value)


def env_rows(env: EnvReport | None) -> list[tuple[str, Any]]:
    """torch, python and CUDA of a run's environment, for a configuration table."""
    if env is None:
        return []
    return [("torch", env.torch), ("python", env.python), ("cuda", env.cuda)]
