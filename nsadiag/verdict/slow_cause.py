"""Why a SLOW run is slow, when the evidence names a class of cause (pure).

From the sampled profile's regions (nsadiag.probes.regions), the "compile" heartbeat
events (nsadiag.probes.recompiles) and the processes sampled at the kill, ``slow_cause``
classifies a run as

- ``data-bound``: the main thread sat in the DataLoader's ``__next__`` in at least
  DATA_BOUND_SHARE of its samples, or in at least DATA_LARGEST_SHARE and in more of them
  than in any one other phase (a loaded machine slows the model's work but not a read's
  wait, so the share falls there; the sentence then says it is under half and what it
  outweighed); with the share, whether it waited (off the CPU) or
  loaded the batch itself, the line it asked from, and each DataLoader worker's line at
  the kill, and whether the workers were idle (a read or a sleep) or busy;
- ``recompiles``: Dynamo compiled again at least MIN_RECOMPILES times and the main thread
  was in the compiler in at least COMPILE_BOUND_SHARE of its samples; with the count, the
  steps the run began (a compile is reported a poll after it ends, so its step is not
  claimed), the compiled function and the last guard that failed;
- ``checkpoint-recompute``: torch.utils.checkpoint's recompute held at least
  RECOMPUTE_SHARE of the backward's samples; with the recomputed forward's hottest line
  and where the checkpoint is called;
- ``outside-model``: at least OUTSIDE_WORK_SHARE of the training samples fell outside the
  model's modules, its backward and its optimizer's step, most at one user line (a loss
  built on a shape the author did not mean, data work inside the loop): that line, with
  its share;
- ``model-compute``: none of the above, and at least OWN_WORK_SHARE of the samples went to
  the model's own work (the forward of its modules, the backward, the optimizer's step):
  no defect, with each part's share and the backward's busiest op.

The class with the largest share of the run's samples wins when several qualify. The
facts are plain dicts (the record's disk format); the sentence is the cause line a report
prints, every figure in it measured here. What to do about it is the finding's
(nsadiag.finding.next_step.slow_next).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from nsadiag.evidence import Evidence, StackSample
from nsadiag.probes.frames import describe_place, main_thread
from nsadiag.verdict.thresholds import (
    COMPILE_BOUND_SHARE,
    DATA_BOUND_SHARE,
    DATA_LARGEST_SHARE,
    INNER_LOOP_MIN,
    INNER_LOOP_PER_STEP,
    MIN_RECOMPILES,
    MIN_WORK_SAMPLES,
    OUTSIDE_WORK_SHARE,
    OWN_WORK_SHARE,
    RECOMPUTE_SHARE,
)

WORKER_ROLE = re.compile(r"^DataLoader worker (\d+)")
SIZE_GUARD = re.compile(r"size mismatch at index (\d+)")


def _training_samples(profile: dict[str, Any]) -> int:
    return int(profile.get("samples", 0)) - int((profile.get("phases") or {}).get("build", 0))


def _workers(evidence: Evidence) -> list[dict[str, Any]]:
    """The DataLoader workers sampled at the kill: worker id, pid, the user line most of
    their samples were in ("where", None when no sample was in the user's code: a worker
    waiting for its next index), its code, in how many samples they were there
    ("in_own"), and in how many py-spy found them active (on the CPU), of how many."""
    found = []
    for other in evidence.others:
        match = WORKER_ROLE.match(str(other.get("role") or ""))
        samples = [StackSample.from_dict(s) for s in
                   (other.get("stall") or {}).get("samples") or []]
        if match is None or not samples:
            continue
        places = [describe_place(sample) or {} for sample in samples]
        own = Counter((p["own"], p.get("own_code")) for p in places if p.get("own"))
        (where, code), in_own = own.most_common(1)[0] if own else ((None, None), 0)
        threads = [main_thread(sample) for sample in samples]
        found.append({"worker": int(match.group(1)), "pid": other.get("pid"),
                      "role": other.get("role"), "where": where, "code": code,
                      "in_own": in_own,
                      "active": sum(1 for thread in threads if thread and thread.active),
                      "samples": len(samples)})
    return sorted(found, key=lambda worker: worker["worker"])


def _largest_other(profile: dict[str, Any], region: dict[str, Any]) -> tuple[str, int] | None:
    """The training phase with the most samples outside the region, and that count."""
    inside = region.get("by_phase") or {}
    outside = {phase: int(count) - int(inside.get(phase, 0)) for phase, count in
               (profile.get("phases") or {}).items() if phase != "build"}
    outside = {phase: count for phase, count in outside.items() if count > 0}
    if not outside:
        return None
    phase = max(outside, key=lambda name: outside[name])
    return phase, outside[phase]


def _data_bound(evidence: Evidence, profile: dict[str, Any]) -> dict[str, Any] | None:
    region = (profile.get("regions") or {}).get("data")
    training = _training_samples(profile)
    if not region or training <= 0:
        return None
    share = region["count"] / training
    other = _largest_other(profile, region)
    largest = other is None or region["count"] > other[1]
    if share < DATA_BOUND_SHARE and not (share >= DATA_LARGEST_SHARE and largest):
        return None
    on_cpu = region.get("on_cpu")
    waited = on_cpu is not None and 2 * on_cpu <= region["count"]
    asked = _first(region.get("entered_from"))
    workers = _workers(evidence)
    doing = "waited for the next batch" if waited else "was in the DataLoader's `__next__`"
    cpu = (f", on the CPU in {on_cpu / region['count']:.0%} of them" if on_cpu is not None
           else "")
    sentence = (f"data-bound: the main process {doing} in {share:.0%} of its samples once "
                f"training began ({region['count']} of {training}{cpu})"
                + (f", asking at {asked}" if asked else ""))
    if share < DATA_BOUND_SHARE and other is not None:
        # under half: say so, and what it outweighed, so the share is read as measured
        sentence += (f", under half but more than any other phase outside it (the "
                     f"{other[0]} phase: {other[1]} samples, {other[1] / training:.0%})")
    if workers:
        lines = sorted({str(w["where"]) for w in workers if w["where"]})
        idle = sum(w["samples"] - w["active"] for w in workers)
        total = sum(w["samples"] for w in workers)
        inside = sum(w["in_own"] for w in workers)
        names = ", ".join(f"{w['worker']} (pid {w['pid']})" for w in workers)
        code = next((f" `{w['code']}`" for w in workers if w["code"]), "") \
            if len(lines) == 1 else ""
        noun = "DataLoader worker" + ("s" if len(workers) > 1 else "")
        at = (f"in the dataset's code at {' and '.join(lines)}{code} in {inside} of "
              f"{total} samples at the kill" if lines else
              f"outside the dataset's code (waiting for work) in all {total} samples at the "
              f"kill")
        verb = "were" if len(workers) > 1 else "was"
        sentence += (f"; its {len(workers)} {noun} {names} {verb} {at}, idle (off the CPU) "
                     f"in {idle} of {total}")
    elif region.get("inner"):
        sentence += (f"; no DataLoader worker process was sampled, and the main process "
                     f"ran the dataset's code itself, most at {region['inner']}")
    else:
        sentence += "; no DataLoader worker process was sampled"
    return {"kind": "data-bound", "share": share, "samples": region["count"],
            "of_samples": training, "waited": waited, "on_cpu": on_cpu,
            "asked_at": asked, "workers": workers, "loaded_at": region.get("inner"),
            "largest_other": ({"phase": other[0], "samples": other[1]} if other else None),
            "sentence": sentence}


def _first(by_phase: dict[str, str] | None) -> str | None:
    """The forward's entry line when there is one, else any phase's."""
    if not by_phase:
        return None
    return by_phase.get("forward") or next(iter(by_phase.values()))


def _recompiles(evidence: Evidence, profile: dict[str, Any]) -> dict[str, Any] | None:
    compiles = [e for e in evidence.events if e.get("kind") == "compile"]
    again = [e for e in compiles if e.get("recompile_reason")]
    region = (profile.get("regions") or {}).get("compile")
    training = _training_samples(profile)
    if len(again) < MIN_RECOMPILES or not region or training <= 0 or \
            region["count"] < COMPILE_BOUND_SHARE * training:
        return None
    share = region["count"] / training
    seen = max(int(e.get("step") or 0) for e in evidence.events) + 1
    guard = re.sub(r"^\d+/\d+: ", "", str(again[-1]["recompile_reason"]))
    size = SIZE_GUARD.search(guard)
    function = again[-1].get("function")
    called = _first(region.get("entered_from"))
    sentence = (f"recompiles: Dynamo compiled `{function}` again {len(again)} times in "
                f"{seen} steps, the last because the guard "
                f"`{guard}` failed; the main process was in the compiler in {share:.0%} of "
                f"its samples once training began ({region['count']} of {training})")
    return {"kind": "recompiles", "share": share, "samples": region["count"],
            "of_samples": training, "recompiles": len(again), "compiles": len(compiles),
            "steps": seen, "function": function,
            "file": again[-1].get("file"), "line": again[-1].get("line"), "guard": guard,
            "size_dim": int(size.group(1)) if size else None, "called_at": called,
            "sentence": sentence}


def _recompute(profile: dict[str, Any]) -> dict[str, Any] | None:
    region = (profile.get("regions") or {}).get("checkpoint")
    backward = int((profile.get("phases") or {}).get("backward", 0))
    recompute = int(((region or {}).get("by_phase") or {}).get("backward", 0))
    if backward <= 0 or recompute < RECOMPUTE_SHARE * backward:
        return None
    training = _training_samples(profile)
    called = (region.get("entered_from") or {}).get("forward")
    inner = region.get("inner")
    sentence = (f"checkpoint recompute: torch.utils.checkpoint reran the forward in "
                f"{recompute / backward:.0%} of the backward's samples ({recompute} of "
                f"{backward})" + (f", hottest at {inner}" if inner else "") +
                (f"; checkpointed at {called}" if called else ""))
    return {"kind": "checkpoint-recompute", "share": recompute / training if training else 0.0,
            "backward_share": recompute / backward, "samples": recompute,
            "of_samples": backward, "inner": inner, "called_at": called,
            "sentence": sentence}


def _inner_loop(evidence: Evidence, profile: dict[str, Any]) -> dict[str, Any] | None:
    """A loop of the user's code that iterated at least INNER_LOOP_PER_STEP times a step
    (with no step recorded, INNER_LOOP_MIN times in all): Python work inside the step, which
    no sample split can call the model's own."""
    steps = int(evidence.event_counts.get("step", 0) or 0)
    for loop in profile.get("loops") or []:
        advanced = int(loop.get("advanced") or 0)
        if advanced >= (INNER_LOOP_PER_STEP * steps if steps else INNER_LOOP_MIN):
            return loop
    return None


def _work(evidence: Evidence, profile: dict[str, Any]) -> dict[str, Any] | None:
    """``outside-model`` or ``model-compute`` from the profile's work split (see the module
    docstring); None with too few samples to say, or when a loop of the user's iterates
    inside the steps (its own finding names it)."""
    work = profile.get("work") or {}
    of = int(work.get("of") or 0)
    if of < MIN_WORK_SAMPLES or _inner_loop(evidence, profile) is not None:
        return None
    outside, line = int(work.get("outside") or 0), work.get("outside_line")
    if outside >= OUTSIDE_WORK_SHARE * of and line:
        code = f" `{line['code']}`" if line.get("code") else ""
        sentence = (f"a line outside the model: {line['where']}{code} holds "
                    f"{int(line['count']) / of:.0%} of the training samples ({line['count']} "
                    f"of {of}), outside the model's modules, its backward and its optimizer "
                    f"step ({outside / of:.0%} of the samples fell outside them)")
        return {"kind": "outside-model", "share": int(line["count"]) / of,
                "samples": int(line["count"]), "of_samples": of, "loaded_at": line["where"],
                "sentence": sentence}
    parts = [(name, int(work.get(key) or 0)) for name, key in (
        ("the backward", "backward"), ("the optimizer's step", "optimizer"),
        ("the forward of its modules", "modules"))]
    if sum(count for _, count in parts) < OWN_WORK_SHARE * of:
        return None  # data waits or other work below every class's bar: no class
    said = ", ".join(f"{name} {count / of:.0%}" for name, count in
                     sorted(parts, key=lambda part: -part[1]) if count)
    ops = profile.get("backward_ops") or []
    busiest = f"; the backward's busiest op {ops[0]['op']}" if ops else ""
    return {"kind": "model-compute", "share": sum(count for _, count in parts) / of,
            "samples": sum(count for _, count in parts), "of_samples": of,
            "inner": f"{said} of the training samples{busiest}",
            "sentence": f"no defect found: the time goes into the model's own work ({said} "
                        f"of the training samples{busiest})"}


def slow_cause(evidence: Evidence, counted: bool = False) -> dict[str, Any] | None:
    """The cause class of a SLOW run (see the module docstring); None when none holds.
    ``counted``: the run's work was counted (slow by size or by defect), which says more
    than where the samples fell: the two work classes are left out."""
    profile = evidence.profile or {}
    found = [cause for cause in (_data_bound(evidence, profile),
                                 _recompiles(evidence, profile), _recompute(profile))
             if cause is not None]
    if found:
        return max(found, key=lambda cause: cause["share"])
    return None if counted else _work(evidence, profile)


def add_slow_cause(evidence: Evidence, facts: dict[str, Any], reasons: list[str]) -> None:
    """The cause's facts ("slow_cause", and "cause": its sentence) and a reason."""
    cause = slow_cause(evidence, counted=facts.get("slow_by") is not None)
    if cause is None:
        return
    facts["slow_cause"] = cause
    facts["cause"] = cause["sentence"]
    reasons.append(f"cause: {cause['sentence']}")
