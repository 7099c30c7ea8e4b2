"""Markdown (+ JSON, + PNG) triage reports from stored trial records.

The shape follows a hand-written hang report — executive summary, configuration, results,
evidence, analysis (ruled out / implicated), minimal reproduction, recommendations — but
every sentence is built from a measured number in the records. `build_report` is the
report of a layer sweep (sweep-layers, isolate-branch); the helpers here (tables, evidence,
redaction) serve every report; nsadiag.render picks the report a run directory gets.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nsadiag.probes.profile import tables as profile_tables
from nsadiag.rundir import TrialRecord
from nsadiag.sweep import SweepRow, analyse, first_failure, row_from_record

RECOMMENDATIONS = {
    "SLOW": "The run is progressing: raise the job's timeout above the ETA, or remove the "
            "hot frame's per-token work (Python loops, host syncs such as .item()).",
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

_IP = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
# full IPv6, and compressed forms with at least four groups (C++ names like c10::add have two)
_IPV6 = re.compile(r"(?<![\w:])(?:(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|"
                   r"(?=(?:[0-9a-fA-F]{0,4}:){4})[0-9a-fA-F]{0,4}(?::[0-9a-fA-F]{1,4})*::"
                   r"[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4})*)(?![\w:])")
_USER_HOST = re.compile(r"\b[\w.-]+@[\w.-]+\b")
_HOME = re.compile(r"/(home|Users)/[^/\s\"'`]+")
_PYTEST_USER = re.compile(r"pytest-of-[^/\s\"'`]+")
_INTERNAL_HOST = re.compile(r"\b(?:[a-zA-Z0-9-]+\.)+"
                            r"(?:internal|local|lan|corp|intra|localdomain)\b")
_SECRET_NAME = r"[A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|KEY|CREDENTIAL|AUTH)[A-Z0-9_]*"
_SECRET = re.compile(rf"(?i)\b({_SECRET_NAME})=[^\s\"'`,;]+")
_SECRET_JSON = re.compile(rf'(?i)("{_SECRET_NAME}"\s*:\s*)"[^"]*"')
_TOKEN_VALUE = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|hf_[A-Za-z0-9]{20,}|"
                          r"sk-[A-Za-z0-9_-]{20,}|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,})")
GENERIC_ACCOUNTS = frozenset({"root", "user", "admin", "nobody", "runner", "ubuntu"})
"""Account names shared by countless machines: they identify no one, and "root" or "user"
also occur as ordinary words, so they are not hidden as whole words."""


def machine_names() -> tuple[set[str], set[str]]:
    """(host names, user names) of this machine and process, read when called."""
    import getpass
    import platform
    import socket

    hosts = {socket.gethostname(), platform.node()}
    try:
        hosts.add(socket.getfqdn())
    except OSError:
        pass
    users = {os.environ.get(name, "") for name in ("USER", "LOGNAME", "USERNAME")}
    try:
        users.add(getpass.getuser())
    except (KeyError, OSError):
        pass
    # two-letter names ("vm") are generic and too likely to occur as words
    hosts = {h for h in hosts if len(h) >= 3 and h not in ("localhost", "localhost.localdomain")}
    users = {u for u in users if len(u) >= 2 and u not in GENERIC_ACCOUNTS}
    return hosts, users


def _whole_word(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-])")


def redact(text: str, hosts: set[str] | None = None, users: set[str] | None = None) -> str:
    """Hide secret-looking values (NAME=value and "NAME": "value" pairs whose name says
    token, secret, password, key, credential or auth, and well-known token formats), IPv4
    and IPv6 addresses, user@host, home directories, internal host names (*.internal,
    *.local, ...) and this machine's host and user names (``machine_names()`` unless given)."""
    if hosts is None or users is None:
        found_hosts, found_users = machine_names()
        hosts = found_hosts if hosts is None else hosts
        users = found_users if users is None else users
    text = _SECRET.sub(r"\1=<redacted>", text)
    text = _SECRET_JSON.sub(r'\1"<redacted>"', text)
    text = _TOKEN_VALUE.sub("<redacted>", text)
    text = _USER_HOST.sub("<user>@<host>", text)
    text = _IP.sub("<ip>", text)
    text = _IPV6.sub("<ip>", text)
    text = _HOME.sub(r"/\1/<user>", text)
    text = _PYTEST_USER.sub("pytest-of-<user>", text)
    for host in sorted(hosts, key=len, reverse=True):  # the FQDN before its first label
        text = _whole_word(host).sub("<host>", text)
    text = _INTERNAL_HOST.sub("<host>", text)
    for user in sorted(users, key=len, reverse=True):
        text = _whole_word(user).sub("<user>", text)
    return text


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 2**30:
        return f"{value / 2**30:.2f} GiB"
    return f"{value / 2**20:.0f} MiB" if value >= 2**20 else f"{value / 2**10:.0f} KiB"


BRANCH_COLUMNS = ("cmp", "sel", "win")


def _fmt_branch(row: SweepRow, branch: str) -> str:
    by_branch = row.saved_by_branch
    if not by_branch or branch not in by_branch:  # not recorded, or not computed
        return "-"
    return fmt_bytes(by_branch[branch])


def results_table(rows: Sequence[SweepRow]) -> list[str]:
    """One line per trial: times as medians over "median of" steps, the step time against
    its expected cost (the dense reference's time for its FLOPs), the peak with the bytes
    saved for backward in all and per NSA branch and the rest of the peak."""
    branch_heads = " | ".join(f"saved {b}" for b in BRANCH_COLUMNS)
    lines = [f"| run | layers | verdict | forward s | backward s | step s | median of | "
             f"vs expected cost | peak RSS | saved for backward | {branch_heads} | "
             f"rest of the peak | steps |",
             "|---|---|---|---|---|---|---|---|---|---|" + "---|" * len(BRANCH_COLUMNS) +
             "---|---|"]
    for r in rows:
        branches = " | ".join(_fmt_branch(r, b) for b in BRANCH_COLUMNS)
        verdict = f"{r.verdict} (by {r.slow_by})" if r.slow_by else r.verdict
        cost = f"{r.cost_ratio:.1f}x" if r.cost_ratio is not None else "-"
        lines.append(f"| {r.label or '-'} | {r.n_layers} | {verdict} | {fmt_s(r.forward_s)} "
                     f"| {fmt_s(r.backward_s)} | {fmt_s(r.step_s)} | {r.timed_steps} | {cost} "
                     f"| {fmt_bytes(r.peak_rss)} | {fmt_bytes(r.saved_bytes)} | {branches} | "
                     f"{fmt_bytes(r.rest_bytes)} | {r.steps_done} |")
    return lines


def fits_section(analysis: dict[str, Any]) -> list[str]:
    fits = analysis["fits"]
    if not fits:
        return ["Fewer than three OK layer counts: no fit."]
    lines = ["| quantity | per layer (± s.e.) | intercept | R² | points | growth | "
             "extrapolated |", "|---|---|---|---|---|---|---|"]
    for name, fit in fits.items():
        unit = fmt_bytes if name in ("peak_rss", "saved_bytes") else (lambda v: f"{v:.3f} s")
        extra = ", ".join(f"{n} layers: {unit(v)}" for n, v in fit.extrapolated.items())
        lines.append(f"| {name} | {unit(fit.slope)} ± {unit(fit.slope_se)} | "
                     f"{unit(fit.intercept)} | {fit.r2:.3f} | {fit.points} | {fit.growth()} | "
                     f"{extra or '-'} |")
    return lines


def attribution_table(full: Sequence[SweepRow], alone: Sequence[SweepRow]) -> list[str]:
    """Per layer count: the branch alone against all branches, time and memory."""
    by_layers = {r.n_layers: r for r in alone}
    lines = ["| layers | step s (all) | step s (branch) | share of time | peak (all) | "
             "peak (branch) |", "|---|---|---|---|---|---|"]
    for row in full:
        other = by_layers.get(row.n_layers)
        if other is None:
            continue
        share = (f"{100 * other.step_s / row.step_s:.0f}%" if other.step_s and row.step_s
                 else "-")
        lines.append(f"| {row.n_layers} | {fmt_s(row.step_s)} | {fmt_s(other.step_s)} | "
                     f"{share} | {fmt_bytes(row.peak_rss)} | {fmt_bytes(other.peak_rss)} |")
    return lines


def stack_excerpt(evidence: dict[str, Any], limit: int = 12) -> list[str]:
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


def last_events(evidence: dict[str, Any], count: int = 8) -> list[str]:
    events = evidence.get("events") or []
    if not events:
        return ["No heartbeat event was written."]
    start = events[0]["t"]
    lines = ["| t (s) | kind | phase | step | module | edge | RSS |",
             "|---|---|---|---|---|---|---|"]
    for e in events[-count:]:
        lines.append(f"| {e['t'] - start:.2f} | {e.get('kind')} | {e.get('phase', '')} | "
                     f"{e.get('step', '')} | {e.get('module', '')} | {e.get('edge', '')} | "
                     f"{fmt_bytes(e.get('rss'))} |")
    return lines


def stall_lines(stall: dict[str, Any]) -> list[str]:
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


def analysis_section(rows: Sequence[SweepRow], analysis: dict[str, Any],
                     failing: TrialRecord | None) -> list[str]:
    ruled_out, implicated = [], []
    ok = [r for r in rows if r.verdict == "OK"]
    if ok:
        best = max(ok, key=lambda r: r.n_layers)
        ruled_out.append(f"A hang at small depth: {len(ok)} layer count(s) up to "
                         f"{best.n_layers} finished every step (step {fmt_s(best.step_s)} s).")
    step_fit = analysis["fits"].get("step_s")
    if step_fit and step_fit.poor:
        step_fit = None  # says nothing either way
    if step_fit and not step_fit.super_linear:
        ruled_out.append(f"Super-linear time growth: step time rises {step_fit.slope:.3f} s per "
                         f"layer on a straight line (R² {step_fit.r2:.3f}).")
    elif step_fit:
        implicated.append(f"Step time grows faster than linearly with depth (quadratic term "
                          f"{step_fit.curvature:.4f} s/layer²).")
    growth = analysis.get("memory_growth")
    if growth and growth["outgrows"]:
        implicated.append(f"The peak grows faster than the bytes saved for backward: from "
                          f"{growth['from']} to {growth['to']} layers the rest of the peak "
                          f"grew {growth['rest']:.1f}x while the saved bytes grew "
                          f"{growth['saved']:.1f}x (peak {growth['peak']:.1f}x): a temporary "
                          f"or a cache that grows faster than the activations sets the peak; "
                          f"`nsadiag memory` names the module.")
    elif growth:
        ruled_out.append(f"A peak outgrowing the activations: from {growth['from']} to "
                         f"{growth['to']} layers the saved bytes grew {growth['saved']:.1f}x "
                         f"and the rest of the peak {growth['rest']:.1f}x.")
    mem_fit = analysis["fits"].get("peak_rss")
    if mem_fit and mem_fit.poor:
        mem_fit = None
    if mem_fit and mem_fit.super_linear:
        implicated.append(f"Peak memory grows faster than linearly with depth (+"
                          f"{fmt_bytes(mem_fit.slope)} per layer on average).")
    elif mem_fit:
        ruled_out.append(f"A memory blow-up with depth: peak RSS grows {fmt_bytes(mem_fit.slope)}"
                         f" per layer, linearly (R² {mem_fit.r2:.3f}).")
    if failing:
        facts = failing.verdict.get("facts", {})
        name = failing.verdict["name"]
        where = facts.get("hot_frame") or facts.get("last_module") or facts.get("frame")
        implicated.append(f"{failing.spec.get('n_layers')} layers end as {name}"
                          + (f", at {where}" if where else "") + ".")
        if name == "SLOW":
            gap = facts.get("since_last_event_s")
            last = f", the last {gap:.1f} s before the kill" if gap is not None else ""
            ruled_out.append("A hang: it was still progressing (heartbeats or sampler "
                             f"pulses) when the budget ran out{last}"
                             + (f"; ETA {facts['eta_s']:.0f} s more." if facts.get("eta_s")
                                else "."))
    return ["Ruled out:", ""] + [f"- {x}" for x in ruled_out or ["nothing yet"]] + \
        ["", "Implicated:", ""] + [f"- {x}" for x in implicated or ["nothing: every trial OK"]]


def cli_value(value: Any) -> str:
    """An override as `--set` reads it back: lists and tuples as a,b."""
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def reproduction(command: Sequence[str] | None, failing: TrialRecord | None) -> list[str]:
    if failing is None:
        return ["Nothing failed; the command that produced this report:", "", "```",
                shlex.join(command or []), "```"]
    spec = failing.spec
    branches = spec.get("branches")
    head = (["nsadiag", "isolate-branch", branches[0]] if branches and len(branches) == 1
            else ["nsadiag", "sweep-layers"])
    args = [*head, "--target", spec["target"], "--layers", str(spec["n_layers"]),
            "--seq-len", str(spec["seq_len"]), "--batch", str(spec["batch"]),
            "--dtype", spec["dtype"], "--device", spec["device"],
            "--steps", str(spec["steps"]), "--seed", str(spec["seed"]),
            "--stall-timeout", f"{spec['stall_timeout_s']:g}", "--budget", f"{spec['budget_s']:g}"]
    if spec.get("backend"):
        args += ["--backend", spec["backend"]]
    if spec.get("grad_ckpt"):
        args.append("--grad-ckpt")
    if spec.get("memory_cap_bytes"):
        args += ["--memory-cap-mb", str(spec["memory_cap_bytes"] // 2**20)]
    for key, value in sorted((spec.get("overrides") or {}).items()):
        args += ["--set", f"{key}={cli_value(value)}"]
    return ["The smallest failing configuration of this run:", "", "```", shlex.join(args),
            "```"]


def plot(rows_by_label: dict[str, Sequence[SweepRow]], path: Path) -> Path | None:
    """Step time and peak memory against layers, one line per label; None without data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(r.step_s for rows in rows_by_label.values() for r in rows):
        return None
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(10, 4))
    for label, rows in rows_by_label.items():
        ok = [r for r in rows if r.step_s is not None]
        ax_t.plot([r.n_layers for r in ok], [r.step_s for r in ok], "o-", label=label or "run")
        mem = [r for r in rows if r.peak_rss]
        ax_m.plot([r.n_layers for r in mem], [r.peak_rss / 2**20 for r in mem], "o-",
                  label=label or "run")
    ax_t.set(xlabel="layers", ylabel="step time (s)", title="time per step")
    ax_m.set(xlabel="layers", ylabel="peak RSS (MiB)", title="peak memory")
    for ax in (ax_t, ax_m):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def build_report(run_dir: Path, records: Sequence[TrialRecord], meta: dict[str, Any],
                 no_redact: bool = False) -> tuple[str, dict[str, Any]]:
    """(markdown, summary) for the records of one run, grouped by their label."""
    labels = meta.get("labels") or {}
    groups: dict[str, list[SweepRow]] = {}
    records = sorted(records, key=lambda r: int(r.spec["n_layers"]))
    for record in records:
        label = labels.get(Path(record.trial_dir).name, "")
        groups.setdefault(label, []).append(row_from_record(record, label))
    all_rows = [r for rows in groups.values() for r in rows]
    analyses = {label: analyse(rows) for label, rows in groups.items()}
    failing = first_failure(records) or next(
        (r for r in records if r.verdict_name == "INCONCLUSIVE"), None)
    big = next((r for r in all_rows if r.slow_by == "size"), None)
    png = plot(groups, run_dir / "sweep.png")
    headline = (f"{failing.verdict_name} at {failing.spec.get('n_layers')} layers"
                if failing else "all trials OK" if big is None else
                f"no failure; slow by size from {big.n_layers} layer(s)")
    md = [f"# nsadiag {meta.get('command_name', 'report')}: {headline}", ""]
    md += ["## Executive summary", ""]
    if failing:
        md += [f"{len(records)} trial(s); the first non-OK is {failing.spec.get('n_layers')} "
               f"layers: **{failing.verdict_name}**. " + failing.verdict["reasons"][0]]
    elif big is not None:
        md += [f"{len(records)} trial(s), none failed: from {big.n_layers} layer(s) the work "
               f"itself outlasts the budget (slow by size: no host read per token, no loop "
               f"of tiny ops). A longer `--budget` or fewer `--steps` lets it finish."]
    else:
        md += [f"{len(records)} trial(s), every one OK."]
    for label, analysis in analyses.items():
        fit = analysis["fits"].get("step_s")
        if fit:
            md += ["", f"{label or 'Run'}: {fit.slope:.3f} ± {fit.slope_se:.3f} s per layer "
                   f"per step ({fit.growth()}, R² {fit.r2:.3f}, {fit.points} points)."]
    first = records[0].spec if records else {}
    md += ["", "## Configuration", "", "| field | value |", "|---|---|"]
    for key in ("target", "seq_len", "batch", "dtype", "grad_ckpt", "branches", "backend",
                "device", "steps", "stall_timeout_s", "budget_s", "memory_cap_bytes",
                "overrides"):
        md.append(f"| {key} | {first.get(key)} |")
    env = meta.get("env") or {}
    if env:
        md.append(f"| torch | {env.get('packages', {}).get('torch')} |")
        md.append(f"| python | {env.get('python')} |")
        md.append(f"| cuda | {env.get('cuda')} |")
    md += ["", "## Results", ""] + results_table(all_rows)
    for label, analysis in analyses.items():
        md += ["", f"### Fits against layers{' — ' + label if label else ''}", ""]
        md += fits_section(analysis)
    if meta.get("branch") and len(groups) == 2:
        md += ["", f"### What the {meta['branch']} branch costs", ""]
        md += attribution_table(*groups.values())
    if png:
        md += ["", f"![time and memory against layers]({png.name})"]
    md += ["", "## Evidence", ""]
    md += evidence_section(failing or records[-1]) if records else ["No trial ran."]
    md += ["", "## Analysis", ""] + analysis_section(all_rows, analyses.get("", next(
        iter(analyses.values()), {"fits": {}})), failing)
    md += ["", "## Minimal reproduction", ""] + reproduction(meta.get("argv"), failing)
    md += ["", "## Recommendations", ""]
    md += [RECOMMENDATIONS.get(failing.verdict_name, "") if failing else
           "Healthy at every tested depth: if the full run still stops, compare its "
           "configuration with this one (sequence length, dtype, world size)."]
    text = "\n".join(md) + "\n"
    summary = {"command": meta.get("command_name"), "headline": headline,
               "verdicts": [{"n_layers": r.n_layers, "label": r.label, "verdict": r.verdict,
                             "slow_by": r.slow_by} for r in all_rows],
               "threshold": int(failing.spec["n_layers"]) if failing else None,
               "rows": [r.to_dict() for r in all_rows],
               "fits": {label: {q: f.to_dict() for q, f in a["fits"].items()}
                        for label, a in analyses.items()},
               "failing": failing.verdict if failing else None,
               "stall": stall_summary(failing) if failing else None}
    if not no_redact:
        text = redact(text)
        summary = json.loads(redact(json.dumps(summary)))
    return text, summary
