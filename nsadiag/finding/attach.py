"""The finding of `nsadiag attach PID`: what a live process (or every rank of a job) read as
over the window, from attach.json (nsadiag.commands.attach).

The process blamed is the odd rank out (the one not waiting where the others wait), else
the first one that is not progressing; its stack samples name the line (a spin's loop, the
lock it waits on, the collective it issued: nsadiag.finding.culprit).
"""

from __future__ import annotations

from typing import Any

from nsadiag.evidence import StackSample
from nsadiag.finding import Culprit, Finding, Item, fail, kind_of, ok, warn
from nsadiag.finding.culprit import busy_culprit, wait_culprit
from nsadiag.finding.numbers import share
from nsadiag.finding.source import Sources, sources_of
from nsadiag.finding.trial import next_action, stall_proof, status_of

NOTHING_STUCK = ("Nothing stuck was seen in the window: if the run still seems to hang, attach "
                 "for longer, or run it under `nsadiag run` for a heartbeat and a deadline.")


def _label(process: dict[str, Any]) -> str:
    return f"rank {process['rank']} (pid {process['pid']})" if process.get("rank") is not None \
        else f"pid {process['pid']}"


def blamed(stored: dict[str, Any]) -> dict[str, Any] | None:
    """The process the verdict is about: an odd rank, else the first not progressing."""
    processes = stored.get("processes") or []
    odd = set((stored["verdict"].get("facts") or {}).get("odd_ranks") or [])
    for process in processes:
        if process.get("rank") in odd:
            return process
    return next((p for p in processes if (p.get("verdict") or {}).get("name") not in
                 (None, "OK")), None)


def _culprit(process: dict[str, Any] | None, sources: Sources) -> Culprit | None:
    if process is None:
        return None
    samples = [StackSample.from_dict(s) for s in (process.get("stall") or {}).get("samples")
               or []]
    name = (process.get("verdict") or {}).get("name")
    if name == "DEADLOCK":
        return wait_culprit(samples, sources)
    if name in ("STALL-BUSY", "STALL-COLLECTIVE") or process.get("collective_frame"):
        native = (process.get("stall") or {}).get("stacks_class") != "busy-python"
        return busy_culprit(samples, sources, native=native)
    return None


def attach_finding(stored: dict[str, Any], meta: dict[str, Any]) -> Finding:
    """The finding of one attach (``stored`` is attach.json, ``meta`` run.json)."""
    verdict = stored["verdict"]
    name, facts = verdict["name"], verdict.get("facts") or {}
    process = blamed(stored)
    culprit = _culprit(process, sources_of(stored))
    own_facts = ((process or {}).get("verdict") or {}).get("facts") or facts
    kind = kind_of(name, facts.get("slow_by"))
    target = f"the ranks under pid {meta['pid']}" if meta.get("ranks") else \
        f"pid {meta['pid']}"
    subject = f"{target}, watched {meta['duration_s']:g} s"
    proof = stall_proof(own_facts) if name in ("STALL-BUSY", "DEADLOCK") else \
        (verdict.get("reasons") or [None])[0]
    action = next_action(name, own_facts, culprit) if name != "OK" else NOTHING_STUCK
    results: list[Item] = []
    for p in stored.get("processes") or []:
        state = (p.get("verdict") or {}).get("name") or "?"
        cpu = f", {share(p['cpu_fraction'])} CPU" if p.get("cpu_fraction") is not None else ""
        text = f"{_label(p)}: {p['state']}{cpu}" + (f", in {p['collective_frame']}"
                                                      if p.get("collective_frame") else "")
        results.append(ok(text) if state == "OK" else fail(text) if state != "INCONCLUSIVE"
                       else warn(text))
    where = f" at {culprit.where()}" if culprit and culprit.line else ""
    implicated = [fail(f"{culprit.where()}: {culprit.why}.")] if culprit else []
    summary = [f"Watched {target} for {meta['duration_s']:g} s without stopping it: "
               f"{stored['state']}."] + [r[:1].upper() + r[1:] + "." for r in
                                         (verdict.get("reasons") or [])[:2]]
    return Finding(command="attach", verdict=name, kind=kind,
                   status=status_of(name, facts.get("slow_by")),
                   headline=f"{name} ({kind}){where}", subject=subject, next_action=action,
                   culprit=culprit, proof=proof, summary=summary, results=results,
                   implicated=implicated)
