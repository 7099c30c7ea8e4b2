"""What a triage found: every decision the triage report shows, from its typed state.

``measure_triage(state, records)`` reads the state (nsadiag.triage.state) and the stored
trials for what the report's sections need beyond the finding: the failure as summary.json
has carried it, which checks ran out of time, the configurations to compare, the
reproduction, the regressions against a baseline, the stages not reached.
``triage_finding`` decides the ``Finding`` from them (verdict, kind, culprit line, proving
number, next action, summary, results, ruled out and implicated), once: `nsadiag triage`
keeps it in finding.json as it ends (``keep_triage_finding``). ``triage_result`` puts the
two together as a ``TriageResult``, which the report (nsadiag.report.triage) only lays
out; ``decide_triage`` does all three.

The finding, in order of precedence:

* the sweep's failing trial, when its repeats reproduced it (a crash, an error or a
  deadlock seen once stands; a timing verdict needs the repeats to agree): its verdict,
  kind and line (nsadiag.finding.culprit: the loop a SLOW by defect iterates, the line a
  stall sits in), with what branch isolation and knob bisection add;
* else the first check that failed: WRONG (or the runner's verdict of a check that
  crashed or stalled) naming its module. A check that ran out of time
  (nsadiag.finding.check.timed_out) is INCONCLUSIVE for that check and decides nothing;
* else inconclusive when the repeats did not reproduce a timing verdict;
* else healthy (or slow by size: the work itself outlasts the budget, done without a
  defect), with a regression when a baseline was given and a measurement got worse.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from nsadiag.checks import CheckResult
from nsadiag.compare import compare_rows, regressions
from nsadiag.finding import Culprit, Finding, Item, fail, kind_of, ok, warn
from nsadiag.finding.check import check_culprit, check_item, check_next, failed, timed_out
from nsadiag.finding.commands import check_command, reproduce
from nsadiag.finding.culprit import culprit_of
from nsadiag.finding.numbers import cost_ratio, duration, share, sig
from nsadiag.finding.sweep import SweepFacts, layer_facts, row_item
from nsadiag.finding.trial import next_action, proof_of, verdict_sentence
from nsadiag.probes.profile import describe as describe_profile
from nsadiag.recordspec import RecordSpec
from nsadiag.rundir import TrialRecord, keep_finding, load_records, parse_stored, read_json
from nsadiag.sweep import SweepRow, analyse, row_from_record
from nsadiag.triage.decide import Confidence, ModuleTime
from nsadiag.triage.state import STAGES, TriageState, TrialRef
from nsadiag.verdict import VerdictName
from nsadiag.verdict.load import machine_sentence, worst_contention
from nsadiag.verdict.triage import check_verdict, triage_verdict
from nsadiag.verdictfacts import VerdictFacts

KNOB_ADVICE = {
    "grad_ckpt": "gradient checkpointing is needed for the failure: compare gradients with "
                 "and without it (`nsadiag check ckpt`) and check what the recompute closes "
                 "over",
    "dtype": "the failure needs the lower precision: look for overflow, dtype casts and "
             "autocast regions in the implicated module",
    "backend": "the failure follows the attention backend: run `nsadiag check parity` and "
               "compare the backends' memory (`nsadiag memory --backend ...`)",
    "branches": "the failure follows the set of computed branches: see the branch isolation "
                "results",
    "seq_len": "the failure needs the long sequence: the cost grows with sequence length "
               "(per-token work, O(S^2) masks or buffers); measure it with `nsadiag memory` "
               "at two lengths",
    "world_size": "the failure needs several processes: run `nsadiag ddp` and compare the "
                  "ranks' collectives",
}


@dataclass
class TriageFailure:
    """What failed, as summary.json's ``failure`` carries it: the verdict, the depth and
    trial (a check's failure: the check, at the checks' depth, no trial), the first
    reason, the repeats' confidence, the module the time went to (a check: the module it
    names), the branches that alone reproduce it, the hottest profiled line, the culprit's
    place and the bisection's minimal knobs and trial."""

    verdict: VerdictName
    n_layers: int | None
    trial: str | None
    reason: str
    check: str | None = None
    confidence: Confidence | None = None
    module: str | None = None
    branches: list[str] = field(default_factory=list)
    hot_frame: str | None = None
    culprit: str | None = None
    minimal: dict[str, Any] | None = None
    minimal_trial: str | None = None

    def __post_init__(self) -> None:
        self.verdict = VerdictName(self.verdict)

    def to_dict(self) -> dict[str, Any]:
        """summary.json's form: ``check`` only for a check's failure, after ``trial``."""
        return {"verdict": self.verdict, "n_layers": self.n_layers, "trial": self.trial,
                **({"check": self.check} if self.check else {}), "reason": self.reason,
                "confidence": self.confidence.to_dict() if self.confidence else None,
                "module": self.module, "branches": self.branches,
                "hot_frame": self.hot_frame, "culprit": self.culprit,
                "minimal": self.minimal, "minimal_trial": self.minimal_trial}


@dataclass
class TriageResult:
    """The triage's finding and the decided facts its report lays out.

    failure          summary.json's ``failure`` (None when nothing failed)
    check_status     each check's status as shown: its verdict, NOT APPLICABLE, or
                     INCONCLUSIVE for one that ran out of time
    check_module     the module each check names (check_module: none for one that passed
                     or ran out of time)
    columns          (heading, trial) of the configuration comparison
    reproduction     the command of the smallest failing configuration (None: nothing
                     failed)
    separately       failed checks that are not the cause of the failure the sweep found
    regression       the deltas against the baseline and which regressed (None: no baseline)
    not_reached      stages the triage did not reach
    efficiency       the trial whose efficiency the summary quotes
    rows             every trial once, labelled by the stage that ran it
    depth            the fits of the sweep stage's trials against layers, the predicted
                     peak and the layer count where memory runs out
    machine          the busiest trial's load readings over the run
                     (nsadiag.verdict.load.worst_contention; None: no trial recorded any)
    machine_text     one sentence on how busy the machine was, with those figures
    """

    finding: Finding
    failure: TriageFailure | None
    check_status: dict[str, str]
    check_module: dict[str, str | None]
    columns: list[tuple[str, str]]
    reproduction: list[str] | None
    separately: list[Item] = field(default_factory=list)
    regression: dict[str, Any] | None = None
    not_reached: list[str] = field(default_factory=list)
    efficiency: TrialRef | None = None
    rows: list[SweepRow] = field(default_factory=list)
    depth: SweepFacts = field(default_factory=SweepFacts)
    machine: dict[str, Any] | None = None
    machine_text: str | None = None

    @property
    def status(self) -> str:
        return self.finding.status


# ---- reading the state ------------------------------------------------------------------------


def _results(state: TriageState) -> list[CheckResult]:
    return state.checks.results if state.checks else []


def check_status(result: CheckResult) -> str:
    """The check's status as shown: the verdict it stands for when that is not its own
    (INCONCLUSIVE for one that ran out of time: nsadiag.verdict.triage.check_verdict), else
    its status (its verdict, or NOT APPLICABLE)."""
    verdict = check_verdict(result.verdict.name)
    return result.status if verdict == result.verdict.name else verdict


def check_module(result: CheckResult) -> str | None:
    """The module a check names: its own, but none for a check that passed or ran out of
    time (INCONCLUSIVE: it decided nothing about any module)."""
    return None if check_status(result) in (VerdictName.OK, VerdictName.INCONCLUSIVE) \
        else result.module


@dataclass
class Unreproduced:
    """The sweep's timing verdict its repeats did not confirm: the failing trial's
    reference and every run's verdict."""

    failing: TrialRef
    verdicts: list[VerdictName]

    def text(self) -> str:
        verdict = self.failing.verdict
        same = sum(v == verdict for v in self.verdicts)
        return (f"{verdict} at {self.failing.n_layers} layer(s) in {same} of "
                f"{len(self.verdicts)} runs ({', '.join(self.verdicts)}), not reproduced: a "
                f"timing verdict the repeats do not confirm (a loaded machine, or a run close "
                f"to its budget)")


def unreproduced(state: TriageState) -> Unreproduced | None:
    """The sweep's timing verdict its repeats did not confirm; None otherwise."""
    failing = state.sweep.failing if state.sweep else None
    if state.repeats is None or state.repeats.reproduced is not False or failing is None:
        return None
    conf = state.repeats.confidence
    return Unreproduced(failing, conf.verdicts if conf else [failing.verdict])


def efficiency_ref(state: TriageState) -> TrialRef | None:
    """The sweep trial whose efficiency the summary quotes: the failing one, else the
    deepest probed one that measured it."""
    measured = [r for r in (state.sweep.probed if state.sweep else [])
                if r.efficiency is not None]
    failing = state.sweep.failing.trial if state.sweep and state.sweep.failing else None
    chosen = next((r for r in measured if r.trial == failing), None)
    return chosen or max(measured, key=lambda r: r.n_layers or 0, default=None)


def hot_module(state: TriageState) -> ModuleTime | None:
    patterns = state.attribution.by_pattern if state.attribution else []
    return patterns[0] if patterns else None


def span_text(state: TriageState) -> str:
    """What the attribution's seconds are shares of: the training time, or its last part
    when the evidence kept only the most recent heartbeat events."""
    a = state.attribution
    if a is None:
        return ""
    if a.events is None or a.events_total is None or a.events_total <= a.events:
        return f"the {sig(a.span_s)} s of training"
    return f"the last {sig(a.span_s)} s of training"


def branch_split(state: TriageState, verdict: str) -> tuple[list[str], list[str]]:
    """(branches that alone end ``verdict``, branches that alone are OK)."""
    runs = state.branches.runs if state.branches else []
    return ([r.branch or "?" for r in runs if r.verdict == verdict],
            [r.branch or "?" for r in runs if r.verdict == "OK"])


def knob_text(knobs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "none"


def _profile_hot_line(runs: list[TrialRecord]) -> str | None:
    """The hottest line of the user's code over the failing runs' sampled profile: where
    the time went, quoted as data, never as the cause."""
    # a run stopped while its model was still being built has a profile with no hot line
    profile = next((run.evidence.profile for run in runs if run.evidence is not None and
                    (run.evidence.profile or {}).get("hot_lines")), None)
    line = ((profile or {}).get("hot_lines") or [None])[0]
    if line is None:
        return None
    return line["where"] + (f" `{line['code']}`" if line.get("code") else "")


def _failing_runs(state: TriageState, records: Mapping[str, TrialRecord]
                  ) -> list[TrialRecord]:
    refs = state.repeats.runs if state.repeats else \
        ([state.sweep.failing] if state.sweep and state.sweep.failing else [])
    return [records[r.trial] for r in refs if r.trial in records]


def _culprit(runs: list[TrialRecord]) -> Culprit | None:
    """The line the failing runs blame: the first run's, else a repeat's."""
    return next((c for c in (culprit_of(run) for run in runs) if c is not None), None)


# ---- items ------------------------------------------------------------------------------------


def _check_items(state: TriageState) -> list[Item]:
    if state.checks is None:
        return []
    if state.checks.skipped:
        return [warn(f"correctness checks: skipped ({state.checks.skipped})")]
    return [check_item(r) for r in _results(state)]


def _row_of(ref: TrialRef, rows: Mapping[str, SweepRow]) -> SweepRow | None:
    return rows.get(ref.trial)


def _stage_items(state: TriageState, rows: Mapping[str, SweepRow]) -> list[Item]:
    """One line per sweep trial, then the repeats, branches and bisection."""
    found: list[Item] = []
    for ref in state.sweep.probed if state.sweep else []:
        row = _row_of(ref, rows)
        if row is not None:
            item = row_item(row)
            found.append(Item(item.mark, f"{item.text} ({ref.trial})"))
    if state.repeats and state.repeats.confidence:
        conf = state.repeats.confidence
        text = (f"repeats: {conf.verdict} in {conf.text()} runs "
                f"({', '.join(conf.verdicts)})")
        found.append(warn(text + ": flaky") if conf.flaky else
                     fail(text) if state.repeats.reproduced else warn(text))
    branches = state.branches
    if branches is not None and branches.skipped:
        found.append(warn(f"branch isolation: skipped ({branches.skipped})"))
    for ref in branches.runs if branches else []:
        found.append((ok if ref.verdict == "OK" else fail)(
            f"{ref.branch} alone: {ref.verdict} ({ref.trial})"))
    bisection = state.bisection
    for test in bisection.tests if bisection else []:
        applied = ", ".join(f"{k}={bisection.changes[k]}" for k in test.applied or [])
        defect = {True: ", defect counted", False: ", no defect counted"}.get(test.defect, "")
        found.append((fail if test.reproduces else ok)(
            f"bisect, baseline with {applied or 'no change'}: {test.verdict}{defect}: "
            f"{'reproduces' if test.reproduces else 'does not reproduce'} ({test.trial})"))
    return found


# ---- the cause --------------------------------------------------------------------------------


def _cause(state: TriageState, failure: TriageFailure | None, culprit: Culprit | None
           ) -> tuple[list[Item], list[Item], list[Item]]:
    """(ruled out, implicated, found separately by the checks)."""
    ruled_out: list[Item] = []
    implicated: list[Item] = []
    separately: list[Item] = []
    ok_refs = [r for r in (state.sweep.probed if state.sweep else []) if r.verdict == "OK"]
    if ok_refs:
        deepest = max(ok_refs, key=lambda r: r.n_layers or 0)
        ruled_out.append(ok(f"A failure at {deepest.n_layers} layer(s) or fewer with this "
                            f"configuration: trial `{deepest.trial}` is OK."))
    for result in _results(state):
        if result.passed and result.applicable:
            ruled_out.append(ok(f"Wrong results of the kind the {result.name} check looks "
                                f"for: {result.summary}."))
        elif failed(result):
            item = fail(f"`{result.module or result.name}` ({result.name} check, "
                        f"{result.verdict.name}): {result.summary}.")
            # a wrong result is not the cause of a slowness or stall measured without it
            (separately if failure and not failure.check else implicated).append(item)
    if not failure or failure.check:
        if not failure:
            implicated.append(ok("Nothing: no trial ended other than OK."))
        return ruled_out, implicated, separately
    verdict = failure.verdict
    if culprit is not None:
        code = f" `{culprit.code}`" if culprit.code else ""
        implicated.append(fail(f"{culprit.where()}{code}: {culprit.why}."))
    implicated.append(fail(f"Depth: {failure.n_layers} layer(s) end {verdict} (trial "
                           f"`{failure.trial}`)."))
    if verdict == "SLOW":
        ruled_out.append(ok("A hang: it was still progressing (heartbeats or sampler pulses) "
                            "when the budget ran out."))
    bad, good = branch_split(state, verdict)
    if bad:
        implicated.append(fail(f"Branch(es) {', '.join(bad)}: alone they end {verdict}."))
    if good:
        ruled_out.append(ok(f"Branch(es) {', '.join(good)}: alone they are OK."))
    hot = hot_module(state)
    if hot and state.attribution and state.attribution.span_s > 0:
        implicated.append(fail(f"`{hot.module}` {hot.phase}: "
                               f"{share(hot.seconds / state.attribution.span_s)} of "
                               f"{span_text(state)}."))
    bisection = state.bisection
    if bisection is not None and bisection.minimal is not None:
        tests = {tuple(t.applied or []): t for t in bisection.tests}
        for knob, value in bisection.changes.items():
            base = bisection.baseline[knob]
            if knob not in bisection.minimal:
                ruled_out.append(ok(f"{knob}={value}: the failure reproduces with "
                                    f"{knob}={base} (trial `{bisection.minimal_trial}`)."))
                continue
            without = tuple(k for k in bisection.minimal if k != knob)
            test = tests.get(without)
            shown = (", its work shows no defect" if test and test.reproduces is False and
                     test.verdict == bisection.verdict else "")
            evidence = f" (trial `{test.trial}`: {test.verdict}{shown})" if test else ""
            implicated.append(fail(f"{knob}={value}: with {knob}={base} instead, the failure "
                                   f"goes away{evidence}."))
    return ruled_out, implicated, separately


# ---- the finding ------------------------------------------------------------------------------


def _failure(state: TriageState, runs: list[TrialRecord], culprit: Culprit | None
             ) -> TriageFailure | None:
    """summary.json's ``failure``: the sweep's reproduced failing trial, else the first
    failed check; None when healthy or inconclusive."""
    failing = state.failing
    bad = [r for r in _results(state) if failed(r)]
    if failing is None and bad:
        check = bad[0]
        return TriageFailure(check.verdict.name, state.checks.n_layers, None, check.summary,
                             check=check.name, module=check.module)
    if failing is None:
        return None
    hot = hot_module(state)
    bisection = state.bisection
    return TriageFailure(
        failing.verdict, failing.n_layers, failing.trial, failing.reason,
        confidence=state.repeats.confidence if state.repeats else None,
        module=f"{hot.module} {hot.phase}" if hot else None,
        branches=branch_split(state, failing.verdict)[0], hot_frame=_profile_hot_line(runs),
        culprit=culprit.where() if culprit else None,
        minimal=bisection.minimal if bisection else None,
        minimal_trial=bisection.minimal_trial if bisection else None)


def _summary(state: TriageState, failure: TriageFailure, record: TrialRecord | None
             ) -> list[str]:
    """The failing configuration in a few sentences (the top block has the line, the proof
    and the next step)."""
    conf = failure.confidence
    same = sum(v == failure.verdict for v in conf.verdicts) if conf else 1
    runs = f" in {same} of {conf.total} runs" if conf else ""
    deepest = state.sweep.deepest_ok if state.sweep else None
    sentences = [f"The target fails at {failure.n_layers} layer(s) with {failure.verdict}"
                 f"{runs}; " + (f"{deepest} layer(s) are OK." if deepest else
                                "even one layer fails."),
                 verdict_sentence(record) if record is not None else
                 failure.reason[:1].upper() + failure.reason[1:] + "."]
    if conf and conf.flaky:
        sentences.append(f"The verdict is flaky: the runs gave {', '.join(conf.verdicts)}.")
    hot = hot_module(state)
    if hot and state.attribution and state.attribution.span_s > 0:
        sentences.append(f"Time goes to `{hot.module}` in {hot.phase} "
                         f"({share(hot.seconds / state.attribution.span_s)} of "
                         f"{span_text(state)}).")
    if failure.branches:
        sentences.append(f"The {', '.join(failure.branches)} branch alone reproduces "
                         f"{failure.verdict}.")
    ref = efficiency_ref(state)
    ratio = cost_ratio(ref.expected_step_s, ref.cost_ratio) if ref else None
    if ratio is not None:
        sentences.append(f"A step took {sig(ratio)}x its expected cost (a dense block's time "
                         f"here for the same FLOPs).")
    if failure.minimal is not None:
        sentences.append(("It needs only " + knob_text(failure.minimal) + " on top of the "
                          "healthy baseline.") if failure.minimal else
                         ("The defect shows with every knob at the healthy baseline too."
                          if failure.verdict == VerdictName.SLOW else
                          "It fails with every knob at the healthy baseline too."))
    if failure.verdict == VerdictName.SLOW and state.trial_budget_s < state.user_budget_s:
        sentences.append(f"The time limit lowered each trial's budget to "
                         f"{state.trial_budget_s:.0f} s.")
    return sentences


def _sweep_finding(state: TriageState, failure: TriageFailure, record: TrialRecord | None,
                   culprit: Culprit | None, reproduction: list[str] | None) -> Finding:
    """The finding of the sweep's failing trial (``record`` None when trials.jsonl lost
    it: then what the state kept of it)."""
    slow_by = record.slow_by if record is not None else \
        state.failing.slow_by if state.failing else None
    facts = record.facts if record is not None else VerdictFacts.of({"slow_by": slow_by})
    kind = kind_of(failure.verdict, slow_by)
    where = f" — {culprit.where()}" if culprit and culprit.line else ""
    action = next_action(failure.verdict, facts, culprit)
    if reproduction:
        action += f" The smallest failing configuration: `{shlex.join(reproduction)}`."
    advice = [KNOB_ADVICE[k][:1].upper() + KNOB_ADVICE[k][1:] + "."
              for k in failure.minimal or {}]
    if failure.confidence and failure.confidence.flaky:
        advice.append("The verdict is flaky: rerun the minimal reproduction several times "
                      "before and after a fix.")
    return Finding(command="triage", verdict=failure.verdict, kind=kind, status="failure",
                   headline=f"{failure.verdict} ({kind}) at {failure.n_layers} "
                            f"layer(s){where}",
                   subject=_subject(state), next_action=action, culprit=culprit,
                   proof=proof_of(record) if record is not None else failure.reason,
                   summary=_summary(state, failure, record),
                   recommendations=advice)


def _subject(state: TriageState) -> str:
    ranks = f", {state.world_size} ranks" if state.world_size > 1 else ""
    return (f"{state.target}, S={state.base_spec.seq_len}, up to {state.max_layers} layer(s)"
            f"{ranks}, {state.max_minutes:g} min")


def _check_finding(state: TriageState, check: CheckResult, command: list[str]) -> Finding:
    kind = kind_of(check.verdict.name)
    where = f" in {check.module}" if check.module else ""
    layer_text = healthy_headline(state)
    return Finding(command="triage", verdict=check.verdict.name, kind=kind, status="failure",
                   headline=f"{check.verdict.name} ({kind}): the {check.name} check fails"
                            f"{where}",
                   subject=_subject(state),
                   next_action=check_next(check) + f" Then check again: "
                                                   f"`{shlex.join(command)}`.",
                   culprit=check_culprit(check), proof=check.summary,
                   summary=[f"The {check.name} check fails{where}: {check.summary}.",
                            f"The layer sweep: {layer_text}."])


def healthy_headline(state: TriageState) -> str:
    """What the sweep found when nothing failed: OK up to n layers, slow by size from m,
    or not complete."""
    sweep = state.sweep
    deepest = sweep.deepest_ok if sweep else None
    big = sweep.slow_by_size if sweep else []
    size = (f"; slow by size from {big[0]} layer(s): the work outlasts the budget, done "
            f"without a defect" if big else "")
    if sweep is None or not sweep.complete:
        fine = "no defect" if big else "OK"
        return (f"no failure found before the triage stopped ({fine} up to {deepest or 0} "
                f"layer(s){size})")
    return (f"no defect up to {deepest} layer(s){size}" if big else
            f"OK up to {deepest} layer(s)")


def _healthy_proof(state: TriageState) -> str | None:
    """How many depths finished, the deepest's step time, the checks that passed."""
    probed = state.sweep.probed if state.sweep else []
    ok_refs = [r for r in probed if r.verdict == "OK"]
    parts = []
    if ok_refs:
        deepest = max(ok_refs, key=lambda r: r.n_layers or 0)
        parts.append(f"{len(ok_refs)} of {len(probed)} depths finished every step, "
                     f"{deepest.n_layers} layer(s)"
                     + (f" in {sig(deepest.step_s)} s a step" if deepest.step_s else ""))
    passed = [r for r in _results(state) if r.passed and r.applicable]
    if passed:
        parts.append(f"{len(passed)} correctness check(s) passed")
    return "; ".join(parts) or None


def _healthy_finding(state: TriageState, regressed: list[dict[str, Any]],
                     unsure: Unreproduced | None) -> Finding:
    big = state.sweep.slow_by_size if state.sweep else []
    verdict = triage_verdict(unsure is not None, bool(big))
    kind = kind_of(verdict, "size" if big else None)
    text = healthy_headline(state)
    timed = [r.name for r in _results(state) if timed_out(r)]
    if unsure:
        why = unsure.text()
        summary = [why[:1].upper() + why[1:] + ".",
                   "Rerun on a quieter machine or with a larger `--budget` to settle it; the "
                   "runs' evidence is in their `trial-<n>/evidence.json`."]
        return Finding(command="triage", verdict=verdict, kind=kind, status="inconclusive",
                       headline=f"{verdict} ({kind}): {why}",
                       subject=_subject(state), proof=why.split(":")[0],
                       next_action="Rerun on a quieter machine, or with a larger --budget, "
                                   "to settle it.", summary=summary)
    proof = _healthy_proof(state)
    summary = [f"No failure: {text}."]
    passed = [r.name for r in _results(state) if r.passed and r.applicable]
    if passed:
        summary.append(f"The {', '.join(passed)} check(s) passed at "
                       f"{state.checks.n_layers} layer(s).")
    if big:
        summary.append("The SLOW trials did the model's work without a host read per token or "
                       "a loop of tiny ops, at the machine's pace; a longer `--budget` or "
                       "fewer `--steps` lets them finish.")
    if timed:
        summary.append(f"The {', '.join(timed)} check(s) ran out of time: INCONCLUSIVE for "
                       f"those checks, not a failure.")
    if regressed:
        summary.append(f"Regression against the baseline: {len(regressed)} measurement(s) "
                       f"worse than the threshold.")
    if state.stopped:
        summary.append(f"Incomplete: {state.stopped}.")
    action = ("Nothing failed: if the full run still stops, triage its own configuration "
              "(sequence length, dtype, world size) with a larger --max-layers.")
    if state.stopped:
        action = ("Rerun with the same --out (it resumes) and a larger --max-minutes to reach "
                  "the stages left.")
    if regressed:
        worst = max(regressed, key=lambda d: d["change"])
        action = (f"Find what made {worst['quantity']} at {worst['n_layers']} layer(s) "
                  f"{worst['change']:+.0%} worse than the baseline: compare the two runs "
                  f"with `nsadiag compare`.")
    return Finding(command="triage", verdict=verdict, kind=kind,
                   status="regression" if regressed else "healthy",
                   headline=f"{verdict} ({kind}): {text}" + (
                       f"; regression: {len(regressed)} measurement(s) worse than the "
                       f"baseline" if regressed else ""),
                   subject=_subject(state), next_action=action, proof=proof, summary=summary)


def _columns(state: TriageState) -> list[tuple[str, str]]:
    sweep = state.sweep
    if sweep is None:
        return []
    columns: list[tuple[str, str]] = []
    by_depth = {r.n_layers: r.trial for r in sweep.probed}
    if sweep.deepest_ok in by_depth:
        columns.append(("healthy (deepest OK)", by_depth[sweep.deepest_ok]))
    if sweep.failing:
        columns.append(("failing", sweep.failing.trial))
    minimal = state.bisection.minimal_trial if state.bisection else None
    if minimal and minimal != (sweep.failing.trial if sweep.failing else None):
        # a bisection test reproduces a SLOW by its counted work even when it finished OK:
        # it is "failing" only when it ended with the failure's verdict
        ref = next((t for t in state.bisection.tests if t.trial == minimal), None) \
            if state.bisection else None
        ended = ref.verdict if ref else None
        failed = sweep.failing is not None and ended == sweep.failing.verdict
        columns.append(("minimal failing" if failed else f"minimal (ended {ended})", minimal))
    return columns


def triage_rows(state: TriageState, records: Mapping[str, TrialRecord]) -> list[SweepRow]:
    """Every trial of the triage once, labelled by the stage that ran it."""
    return [row_from_record(records[trial], label) for trial, label in state.labels().items()
            if trial in records]


def reproducing_record(failure: TriageFailure, records: Mapping[str, TrialRecord]
                       ) -> TrialRecord | None:
    """The trial the reproduction names: the smallest configuration this triage ran that
    ended with the failure's own verdict (the bisection's minimal trial, else the sweep's
    failing trial); None when no recorded trial did. A bisection test can count the defect
    in a trial that still finished OK (its work shows it, its time did not run out): its
    command prints OK, so it is never named as failing."""
    for trial in (failure.minimal_trial, failure.trial):
        record = records.get(trial) if trial else None
        if record is not None and record.verdict_name == failure.verdict:
            return record
    return None


@dataclass
class TriageMeasured:
    """What a triage's finding is decided from and its report shows beside it, read from
    its state and trials: the fields of ``TriageResult`` but the finding, with the culprit
    line, the unreproduced timing verdict and the regressed measurements the finding
    names."""

    failure: TriageFailure | None
    culprit: Culprit | None
    unsure: Unreproduced | None
    regressed: list[dict[str, Any]]
    check_status: dict[str, str]
    check_module: dict[str, str | None]
    columns: list[tuple[str, str]]
    reproduction: list[str] | None
    separately: list[Item]
    regression: dict[str, Any] | None
    not_reached: list[str]
    efficiency: TrialRef | None
    rows: list[SweepRow]
    depth: SweepFacts
    machine: dict[str, Any] | None
    machine_text: str | None


def measure_triage(state: TriageState, records: Mapping[str, TrialRecord],
                   memory: int | None = None) -> TriageMeasured:
    """What the triage's state and trials say beside its finding (see TriageMeasured);
    ``memory`` is the machine memory the depth's cliff is predicted against (this
    machine's when None)."""
    rows = triage_rows(state, records)
    runs = _failing_runs(state, records)
    culprit = _culprit(runs) if state.failing else None
    failure = _failure(state, runs, culprit)
    regression = None
    regressed: list[dict[str, Any]] = []
    if state.regression is not None:
        deltas = [d.to_dict() for d in compare_rows(state.regression.rows,
                                                    [r.to_dict() for r in rows],
                                                    state.regression.threshold)]
        regressed = regressions(deltas)
        regression = {"path": state.regression.path, "threshold": state.regression.threshold,
                      "deltas": deltas, "regressed": regressed}
    reproduction = None
    if failure and failure.check:
        reproduction = check_command(failure.check, RecordSpec.from_dict(state.base_spec.to_dict()),
                                     failure.n_layers, state.world_size)
    elif failure:
        minimal = reproducing_record(failure, records)
        reproduction = reproduce(minimal.spec) if minimal else None
    separately = _cause(state, failure, culprit)[2]
    machine = worst_contention(r.evidence.load if r.evidence is not None else None
                               for r in records.values())
    return TriageMeasured(
        failure=failure, culprit=culprit, unsure=unreproduced(state), regressed=regressed,
        machine=machine, machine_text=machine_sentence(machine) if machine else None,
        check_status={r.name: check_status(r) for r in _results(state)},
        check_module={r.name: check_module(r) for r in _results(state)},
        columns=_columns(state), reproduction=reproduction, separately=separately,
        regression=regression,
        not_reached=[s for s in STAGES if s not in state.stages_done] if state.stopped
        else [], efficiency=efficiency_ref(state), rows=rows,
        depth=_depth_facts(rows, memory or psutil.virtual_memory().total))


def triage_finding(state: TriageState, records: Mapping[str, TrialRecord],
                   measured: TriageMeasured) -> Finding:
    """The triage's finding (see the module docstring), decided once: by `nsadiag triage`
    as it ends, or for a run directory that kept none, as its report is rendered."""
    failure, culprit = measured.failure, measured.culprit
    if failure and failure.check:
        bad = next(r for r in _results(state) if r.name == failure.check)
        finding = _check_finding(state, bad, measured.reproduction or [])
    elif failure:
        finding = _sweep_finding(state, failure, records.get(failure.trial or ""), culprit,
                                 measured.reproduction)
    else:
        finding = _healthy_finding(state, measured.regressed, measured.unsure)
    finding.ruled_out, finding.implicated, _ = _cause(state, failure, culprit)
    by_trial = {Path(r.trial_dir).name: r for r in measured.rows}
    finding.results = _check_items(state) + _stage_items(state, by_trial)
    if failure and not failure.check and state.env_problems:
        finding.results.append(warn("environment: " + "; ".join(state.env_problems)))
    return finding


def keep_triage_finding(run_dir: Path) -> Finding:
    """Decide the finding of the triage in ``run_dir`` once, as it ends, and keep it in the
    run directory's finding.json with this machine's memory (the depth's cliff was
    predicted against it). It is decided from the state and trials as stored: triage.json
    redacted as the report reads it, so the kept finding names nothing the state hides
    and a later render lays out what a render decided then would."""
    state = parse_stored("triage.json", TriageState.from_dict,
                         read_json(run_dir / "triage.json", "triage.json"))
    records = stored_trials(run_dir)
    memory = psutil.virtual_memory().total
    finding = triage_finding(state, records, measure_triage(state, records, memory))
    keep_finding(run_dir, finding, machine_memory=memory)
    return finding


def stored_trials(run_dir: Path) -> dict[str, TrialRecord]:
    """A triage's trials (trials.jsonl) by their trial directory's name."""
    return {Path(r.trial_dir).name: r for r in load_records(run_dir / "trials.jsonl")}


def triage_result(measured: TriageMeasured, finding: Finding) -> TriageResult:
    """What the triage report lays out: ``finding`` and what was measured beside it."""
    return TriageResult(
        finding=finding, failure=measured.failure, check_status=measured.check_status,
        check_module=measured.check_module, columns=measured.columns,
        reproduction=measured.reproduction, separately=measured.separately,
        regression=measured.regression, not_reached=measured.not_reached,
        efficiency=measured.efficiency, rows=measured.rows, depth=measured.depth,
        machine=measured.machine, machine_text=measured.machine_text)


def decide_triage(state: TriageState, records: Mapping[str, TrialRecord],
                  memory: int | None = None) -> TriageResult:
    """The triage's finding and the facts its report shows (see the module docstring)."""
    measured = measure_triage(state, records, memory)
    return triage_result(measured, triage_finding(state, records, measured))


def _depth_facts(rows: list[SweepRow], memory: int) -> SweepFacts:
    """The sweep stage's fits against layers and what they predict against ``memory``."""
    sweep = [r for r in rows if r.label == "sweep"]
    analysis = analyse(sweep)
    return layer_facts(sweep, analysis["fits"], analysis["memory_growth"], memory)


def profile_sentences(record: TrialRecord) -> list[str]:
    """The sampled profile of a trial in sentences (nsadiag.probes.profile.describe)."""
    profile = record.evidence.profile if record.evidence is not None else None
    return [s[:1].upper() + s[1:] + "." for s in describe_profile(profile)] if profile else []


def time_text(state: TriageState, not_reached: list[str]) -> str:
    """The limit, the time used, the trial budget, and where a stopped triage stopped."""
    text = (f"Limit {state.max_minutes:g} min; used {duration(state.elapsed_s or 0)}. Trial "
            f"budget {state.trial_budget_s:.0f} s (asked: {state.user_budget_s:g} s).")
    if state.stopped:
        text += (f" {state.stopped[:1].upper()}{state.stopped[1:]}. Not reached: "
                 f"{', '.join(not_reached) or 'nothing'}. Rerun with the same --out to "
                 f"resume.")
    return text
