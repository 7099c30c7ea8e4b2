"""Markdown building blocks every report shares: numbers, tables, evidence, reproduction.

Everything here is pure formatting of stored records and rows (no file is read): units
(``fmt_s``, ``fmt_bytes``), tables from pandas DataFrames (``md_table``), a trial's
evidence (verdict reasons, stall facts, last heartbeat events, the last stack sample,
the traceback's tail), and the command that reproduces a failing trial.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsadiag.probes.profile import tables as profile_tables
from nsadiag.rundir import TrialRecord

if TYPE_CHECKING:
    import pandas as pd

RECOMMENDATIONS = {
    "SLOW": "The run is progressing: give the job the time it needs, or remove the hot "
            "frame's per-token work (Python loops, host syncs such as .item()).",
    "STALL-BUSY": "A single operation runs without module boundaries for longer than the "
                  "stall timeout: inspect the hot frame; raise --stall-timeout if it is "
                  "expected to be long.",
    "STALL-COLLECTIVE": "Ranks disagree on the collectives they issue: compare the per-rank "
                        "positions and look for data-dependent control flow.",
    "DEADLOCK": "Threads wait on each other with no CPU use: look at the waiting frame's "
                "lock or condition and who holds it.",
    "OOM": "Memory runs out: look at the memory growth per layer and per sequence length; "
           "use gradient checkpointing or a memory-bounded attention backend.",
    "ERROR": "An exception ends the run: the traceback names the failing frame.",
    "CRASH": "The process died from a signal in native code: rerun the minimal reproduction "
             "under gdb or with faulthandler output.",
}
"""What to do next, by verdict."""


def recommendation(verdict: Mapping[str, Any]) -> str:
    """What to do next about one verdict (a dict): the next step its facts measured (a
    SLOW's names the ETA only where one was measured), else the verdict's general
    advice."""
    return str((verdict.get("facts") or {}).get("next_step") or
               RECOMMENDATIONS.get(verdict.get("name", ""), ""))

BRANCH_COLUMNS = ("cmp", "sel", "win")


def fmt_s(value: float | None) -> str:
    """Seconds with two decimals; "-" for no value."""
    return "-" if value is None or value != value else f"{value:.2f}"


def fmt_bytes(value: float | None) -> str:
    """Bytes in KiB, MiB or GiB; "-" for no value."""
    if value is None or value != value:
        return "-"
    if value >= 2**30:
        return f"{value / 2**30:.2f} GiB"
    return f"{value / 2**20:.0f} MiB" if value >= 2**20 else f"{value / 2**10:.0f} KiB"


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
    for column in ("timed_steps", "cost_ratio", "rest_bytes", "slow_by", "peak_cuda"):
        if column not in frame:
            frame[column] = None
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
    formats = {**{c: fmt_s for c in ("forward s", "backward s", "step s")},
               **{c: fmt_bytes for c in byte_columns}, "layers": str, "steps": str,
               "median of": lambda n: "-" if _missing(n) else str(int(n)),
               "vs expected cost": lambda r: "-" if _missing(r) else f"{r:.1f}x"}
    return md_table(table, formats)


def stack_excerpt(evidence: Mapping[str, Any], limit: int = 12) -> list[str]:
    """The last stack sample of a stopped trial, four threads at most."""
    stall = evidence.get("stall") or {}
    samples = stall.get("samples") or []
    if not samples:
        reasons = stall.get("unavailable") or []
        return [f"No stack samples ({'; '.join(reasons) or 'none were needed'})."]
    lines = ["```"]
    for thread in samples[-1]["threads"][:4]:
        lines.append(f"thread {thread.get('name') or thread['thread_id']}"
                     f"{'' if thread.get('active', True) else ' (idle)'}:")
        for frame in thread["frames"][:limit]:
            native = " [native]" if frame.get("is_native") else ""
            lines.append(f"  {frame['function']} ({Path(frame.get('file') or '?').name}:"
                         f"{frame.get('line', 0)}){native}")
    lines.append("```")
    return lines


def last_events(evidence: Mapping[str, Any], count: int = 8) -> list[str]:
    """The last heartbeat events, times from the first one."""
    import pandas as pd

    events = evidence.get("events") or []
    if not events:
        return ["No heartbeat event was written."]
    frame = pd.DataFrame(events[-count:]).reindex(
        columns=["t", "kind", "phase", "step", "module", "edge", "rss"])
    frame["t"] = frame["t"] - events[0]["t"]
    frame.columns = ["t (s)", "kind", "phase", "step", "module", "edge", "RSS"]
    return md_table(frame, {"t (s)": lambda v: f"{v:.2f}", "RSS": fmt_bytes,
                            "step": lambda v: str(int(v))})


def stall_lines(stall: Mapping[str, Any]) -> list[str]:
    """What the stacks read as and which backward never finished, when the runner
    stopped the trial (nothing for a trial that ended by itself)."""
    if not stall:
        return []
    samples = stall.get("samples") or []
    lines = []
    if stall.get("stacks_class"):
        note = next((s["note"] for s in samples if s.get("note")), None)
        lines.append(f"- Stacks read as **{stall['stacks_class']}** over {len(samples)} "
                     f"sample(s)" + (f" ({note})" if note else ""))
    unfinished = stall.get("unfinished_backward") or []
    lines.append("- Backward started and never finished: " + (
        ", ".join(f"`{m}`" for m in unfinished) + " (innermost first)" if unfinished
        else "none (no module's backward was open)"))
    return lines


def stall_summary(record: TrialRecord) -> dict[str, Any] | None:
    """The stall facts of a stopped trial for summary.json, None when it ended by itself."""
    stall = record.evidence.get("stall")
    if not stall:
        return None
    return {"stacks_class": stall.get("stacks_class"),
            "unfinished_backward": stall.get("unfinished_backward") or [],
            "cpu_fraction": (stall["cpu_delta_s"] / stall["window_s"]
                             if stall.get("cpu_delta_s") is not None and stall.get("window_s")
                             else None),
            "unavailable": stall.get("unavailable") or [], "gpu": record.gpu}


def evidence_section(record: TrialRecord) -> list[str]:
    """A trial's verdict and reasons, stall facts, GPU state, last events, last stack
    sample and the traceback's last lines."""
    verdict, evidence = record.verdict, record.evidence
    layers = record.spec.get("n_layers")
    shape = f" ({layers} layers)" if layers is not None else ""
    lines = [f"Trial `{Path(record.trial_dir).name}`{shape}: **{verdict['name']}**", ""]
    lines += [f"- {reason}" for reason in verdict["reasons"]]
    stall = evidence.get("stall") or {}
    if stall.get("cpu_delta_s") is not None and stall.get("window_s"):
        lines.append(f"- CPU time over the {stall['window_s']:.1f} s watch window: "
                     f"{stall['cpu_delta_s']:.2f} s")
    lines += stall_lines(stall)
    if verdict["name"] != "OK" and evidence.get("profile"):
        lines += [""] + profile_tables(evidence["profile"]) + [""]
    for missing in stall.get("unavailable") or []:
        lines.append(f"- Evidence unavailable: {missing}")
    if isinstance(record.gpu, str):
        lines.append(f"- {record.gpu}")
    for device in record.gpu if isinstance(record.gpu, list) else []:
        lines.append(f"- GPU {device['index']} {device['name']}: {device['util_gpu_pct']}% busy, "
                     f"{fmt_bytes(device['mem_used'])} of {fmt_bytes(device['mem_total'])}, "
                     f"throttle reasons {device.get('throttle_reasons')}")
    exception = (evidence.get("result") or {}).get("exception")
    lines += ["", "Last heartbeat events:", ""] + last_events(evidence)
    lines += ["", "Stacks (last sample):", ""] + stack_excerpt(evidence)
    if exception:
        tail = exception.get("traceback", "").strip().splitlines()[-8:]
        lines += ["", "Traceback (last lines):", "", "```", *tail, "```"]
    return lines


def cli_value(value: Any) -> str:
    """An override as `--set` reads it back: lists and tuples as a,b."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def trial_options(spec: Mapping[str, Any], layers: bool = True) -> list[str]:
    """The command-line options that give a trial this spec (every knob, so the command
    reproduces it whatever the defaults)."""
    args = ["--target", spec["target"]]
    if layers and spec.get("n_layers") is not None:
        args += ["--layers", str(spec["n_layers"])]
    args += ["--seq-len", str(spec["seq_len"]), "--batch", str(spec["batch"]),
             "--dtype", spec["dtype"], "--device", spec["device"],
             "--steps", str(spec["steps"]), "--seed", str(spec["seed"]),
             "--stall-timeout", f"{spec['stall_timeout_s']:g}", "--budget",
             f"{spec['budget_s']:g}"]
    if spec.get("backend"):
        args += ["--backend", spec["backend"]]
    if spec.get("grad_ckpt"):
        args.append("--grad-ckpt")
    if spec.get("memory_cap_bytes"):
        args += ["--memory-cap-mb", str(spec["memory_cap_bytes"] // 2**20)]
    for key, value in sorted((spec.get("overrides") or {}).items()):
        args += ["--set", f"{key}={cli_value(value)}"]
    return args


def reproduction(command: Sequence[str] | None, failing: TrialRecord | None) -> list[str]:
    """The command of the smallest failing trial (isolate-branch when one branch was
    computed), or the run's own command when nothing failed."""
    if failing is None:
        return ["Nothing failed; the command that produced this report:", "", "```",
                shlex.join(command or []), "```"]
    spec = failing.spec
    branches = spec.get("branches")
    head = (["nsadiag", "isolate-branch", branches[0]] if branches and len(branches) == 1
            else ["nsadiag", "sweep-layers"])
    return ["The smallest failing configuration of this run:", "", "```",
            shlex.join([*head, *trial_options(spec)]), "```"]


def config_table(spec: Mapping[str, Any], keys: Sequence[str],
                 extra: Sequence[tuple[str, Any]] = ()) -> list[str]:
    """The "field | value" table of a configuration."""
    lines = ["| field | value |", "|---|---|"]
    lines += [f"| {key} | {cell(spec.get(key)) if spec.get(key) is not None else None} |"
              for key in keys]
    lines += [f"| {name} | {value} |" for name, value in extra]
    return lines


def env_rows(env: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """torch, python and CUDA of a run's environment, for a configuration table."""
    if not env:
        return []
    return [("torch", (env.get("packages") or {}).get("torch")), ("python", env.get("python")),
            ("cuda", env.get("cuda"))]
