"""Was the machine contended while a job ran? Pure reading of the load figures of one job.

Every job records the machine's load at its start and end (nsadiag.harness.machine.machine_load:
the 1, 5 and 15 minute load averages, the CPUs this process may use, and the cumulative
``/proc/stat`` CPU times with the steal column where the kernel reports one) and the CPU
use of each process's main thread over its life (on-CPU and run-queue seconds).
``contention(load)`` turns them into figures relative to the CPUs the job could use:

- ``load_per_cpu``: the larger 1-minute load average of start and end over the usable CPUs
  (runnable tasks per CPU); ``others_per_cpu`` the same less the job's own main threads'
  demand for the CPU (on-CPU plus run-queue seconds per second, where recorded): above
  LOADED_PER_CPU the job shares its CPUs with other work;
- ``steal``: the part of all CPU time between start and end that a hypervisor gave to other
  guests (``/proc/stat`` steal over the total), None where the kernel has no steal column
  or the two readings are missing;
- ``got``: the part of the CPU the job's main thread asked for (on-CPU plus run-queue
  seconds) that it received, the lowest over the job's processes;
- ``contended``: any of others_per_cpu above LOADED_PER_CPU, steal at or above
  STEAL_CONTENDED, got below GOT_CONTENDED; ``why`` says which.

A timing verdict (SLOW, STALL-BUSY) read on a contended machine is one a quieter machine
must confirm; counts (host reads, FLOPs per op) are not timings and stand at any load.
Contention has a limit, though: a thread that received a share ``got`` of the CPU it asked
for ran at most 1 / got times longer than it would have alone (``stretch_limit``), so a run
measured many times slower than that against what its shape should take is slow whatever
the load (``contention_sentence`` with a slowness says which).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nsadiag.verdict.thresholds import (
    GOT_CONTENDED,
    LOADED_PER_CPU,
    SHARED_GOT,
    SHARED_PER_CPU,
    STEAL_CAP,
    STEAL_CONTENDED,
)


def cpu_steal(start: Mapping[str, Any] | None, end: Mapping[str, Any] | None) -> float | None:
    """Steal jiffies over all jiffies between two ``/proc/stat`` readings ({"steal",
    "total"}); None when either reading or the steal column is missing, or no time passed."""
    if not start or not end or start.get("steal") is None or end.get("steal") is None:
        return None
    total = end["total"] - start["total"]
    if total <= 0:
        return None
    return max(0.0, (end["steal"] - start["steal"]) / total)


def _load_per_cpu(reading: Mapping[str, Any] | None) -> float | None:
    if not reading:
        return None
    loadavg, cpus = reading.get("loadavg") or [], reading.get("cpus")
    if not loadavg or loadavg[0] is None or not cpus:
        return None
    return float(loadavg[0]) / cpus


def contention(load: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The figures described in the module docstring, None when nothing was recorded."""
    if not load:
        return None
    start, end = load.get("start"), load.get("end")
    per_cpu = [x for x in (_load_per_cpu(start), _load_per_cpu(end)) if x is not None]
    threads = (load.get("main_thread") or {}).values()
    got = [use["got"] for use in threads if use.get("got") is not None]
    own = sum(use.get("demand") or 0.0 for use in threads)
    cpus = (end or start or {}).get("cpus")
    found: dict[str, Any] = {
        "load_per_cpu": max(per_cpu) if per_cpu else None,
        "others_per_cpu": max(0.0, max(per_cpu) - own / cpus) if per_cpu and cpus else None,
        "loadavg": [(r or {}).get("loadavg", [None])[0] for r in (start, end)],
        "usable_cpus": (end or start or {}).get("cpus"),
        "steal": cpu_steal((start or {}).get("cpu_stat"), (end or {}).get("cpu_stat")),
        "got": min(got) if got else None}
    why = []
    if found["others_per_cpu"] is not None and found["others_per_cpu"] > LOADED_PER_CPU:
        why.append(f"{found['others_per_cpu']:.1f} runnable tasks per usable CPU besides "
                   f"the job's own")
    if found["steal"] is not None and found["steal"] >= STEAL_CONTENDED:
        why.append(f"{found['steal']:.0%} of the CPU time stolen by the hypervisor")
    if found["got"] is not None and found["got"] < GOT_CONTENDED:
        why.append(f"the main thread received {found['got']:.0%} of the CPU it asked for")
    if all(value is None for key, value in found.items() if key != "loadavg"):
        return None
    found["contended"], found["why"] = bool(why), why
    return found


def stretch_limit(found: Mapping[str, Any]) -> float | None:
    """How many times longer contention can have made a CPU-bound run: 1 / got (the share
    of the CPU the main thread asked for that it received), else the runnable tasks per
    usable CPU (each gets at least its share), over the part of the CPU time the hypervisor
    did not steal; None when neither is known."""
    got, per_cpu = found.get("got"), found.get("load_per_cpu")
    kept = 1.0 - min(float(found.get("steal") or 0.0), STEAL_CAP)
    if got:
        return 1.0 / (float(got) * kept)
    if per_cpu is not None:
        return max(1.0, float(per_cpu)) / kept
    return None


def explains(found: Mapping[str, Any], factor: float) -> bool | None:
    """Whether contention can explain a run ``factor`` times slower than it should be:
    factor within ``stretch_limit``; None when the limit is unknown."""
    limit = stretch_limit(found)
    return None if limit is None else factor <= limit


def contention_sentence(found: Mapping[str, Any], slowness: Mapping[str, Any] | None = None,
                        counted: bool = False) -> str:
    """One sentence with the figures and whether they mean contention. ``slowness``
    ({"factor", "basis"}: how many times slower than it should be the run was, and the
    words saying so) tells whether contention can explain it; ``counted`` says the verdict
    rests on a count, which load does not change."""
    parts = []
    loads = [x for x in found.get("loadavg") or [] if x is not None]
    if loads and found.get("usable_cpus"):
        parts.append(f"load average {max(loads):.1f} on {found['usable_cpus']} usable CPU(s)")
    parts.append("steal " + (f"{found['steal']:.0%}" if found.get("steal") is not None
                             else "not reported"))
    if found.get("got") is not None:
        parts.append(f"the main thread received {found['got']:.0%} of the CPU it asked for")
    figures = ", ".join(parts)
    if not found.get("contended"):
        return f"the machine was not contended: {figures}"
    said = f"the machine was contended ({'; '.join(found['why'])}): {figures}"
    limit = stretch_limit(found)
    if slowness is not None and limit is not None:
        stretch = f"contention stretches a run {limit:.1f}x at most, and {slowness['basis']}"
        if slowness["factor"] > limit:
            return f"{said}; {stretch}: contention does not explain the slowness"
        return (f"{said}; {stretch}: contention alone could explain it, which a quieter "
                f"machine must confirm")
    if counted:
        return f"{said}; the verdict rests on a count, which the load does not change"
    return f"{said}; a timing read here must be confirmed on a quieter machine"


def worst_contention(loads: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """``contention`` of the most contended of several jobs' load readings (the most
    runnable tasks besides the job's own, then the smallest CPU share received), with
    ``jobs`` (how many recorded a load) and ``contended_jobs``; None when none did."""
    found = [c for c in map(contention, loads) if c is not None]
    if not found:
        return None
    worst = max(found, key=lambda c: (c["contended"], c.get("others_per_cpu") or 0.0,
                                      -(c["got"] if c.get("got") is not None else 1.0)))
    return {**worst, "jobs": len(found), "contended_jobs": sum(c["contended"] for c in found)}


def machine_sentence(found: Mapping[str, Any]) -> str:
    """One sentence on the machine over a run's jobs (``worst_contention``), with the
    figures of the most contended one: contended, shared with other work (below contention,
    at SHARED_PER_CPU other tasks per usable CPU or a main thread receiving less than
    SHARED_GOT of the CPU it asked for: stated, no verdict changes), or not contended."""
    figures = []
    loads = [x for x in found.get("loadavg") or [] if x is not None]
    if loads and found.get("usable_cpus"):
        figures.append(f"load average {max(loads):.1f} on {found['usable_cpus']} usable CPU(s)")
    if found.get("others_per_cpu") is not None:
        figures.append(f"{found['others_per_cpu']:.1f} runnable tasks per usable CPU besides "
                       f"the trial's own")
    if found.get("got") is not None:
        figures.append(f"the main thread received {found['got']:.0%} of the CPU it asked for")
    if found.get("steal") is not None:
        figures.append(f"steal {found['steal']:.0%}")
    jobs, contended = found["jobs"], found["contended_jobs"]
    shared = ((found.get("others_per_cpu") or 0.0) >= SHARED_PER_CPU
              or (found.get("got") is not None and found["got"] < SHARED_GOT))
    if contended:
        state = (f"contended during {contended} of {jobs} trial(s) ({'; '.join(found['why'])}"
                 f"): a timing verdict there needs a quieter machine to confirm it")
    elif shared:
        state = (f"shared with other work during the {jobs} trial(s), below the contention "
                 f"that makes a timing verdict inconclusive")
    else:
        state = f"not contended during any of {jobs} trial(s)"
    return f"{state}; the busiest: {', '.join(figures) or 'no figures recorded'}"
