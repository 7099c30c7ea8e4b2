"""A slow run's cause and a crash's top block from their evidence: per-iteration host-read
advice only for a loop whose body reads the host, no time to finish a loop the process had
left, generated code never the user's, and a crash's signal and time as recorded."""

from __future__ import annotations

from pathlib import Path

from nsadiag.evidence import StackFrame
from nsadiag.finding import Culprit
from nsadiag.finding.culprit import host_read_in, retain_culprit, training_loop
from nsadiag.finding.source import Sources, capture, carried_sources
from nsadiag.finding.trial import next_action, proof_of, verdict_sentence
from nsadiag.probes.frames import own_code
from nsadiag.rundir import TrialRecord
from nsadiag.verdict import Verdict
from nsadiag.verdict.slow import _loop_sentence
from nsadiag.verdictfacts import VerdictFacts
from tests.helpers import REPO, evidence_of

LOOP = {"variable": "t", "last": 1407, "end": 2048, "pass_rate_per_s": 3.7, "eta_s": 0.4,
        "phase": "forward", "module": "blocks.0", "where": "forward (model.py:57)",
        "file": "/home/u/model.py", "for_line": 57}


def test_a_loop_whose_body_reads_the_host_is_named_with_that_line(tmp_path):
    source = tmp_path / "loss.py"
    source.write_text("def loss(targets):\n"
                      "    seen = set()\n"
                      "    for i in range(len(targets)):\n"
                      "        token = targets[i].item()  # one read per token\n"
                      "        seen.add(token)\n"
                      "    return seen\n")
    here = Sources(live=True)  # this machine's file, as where the record is made
    assert host_read_in(here, str(source), (3, 5)) == "4 `token = targets[i].item()  # one " \
                                                      "read per token`"
    assert host_read_in(here, str(source), (2, 3)) is None  # the header alone is not the body
    # what the record carries of the file (the loop's header named) holds the same line
    stored = carried_sources(capture({"file": str(source), "line": 3}))
    assert host_read_in(stored, str(source), (3, 5)) == host_read_in(here, str(source), (3, 5))
    assert stored.code_at(str(source), 2) is None  # a line no finding reads is not kept


def test_per_iteration_advice_only_for_a_loop_that_reads_the_host():
    reads = Culprit("loss.py", 3, "the loop over `i`", 5, host_read="4 `t = x[i].item()`")
    plain = Culprit("loss.py", 3, "the loop over `i`", 5)
    said = next_action("SLOW", VerdictFacts.of({"slow_by": None}), reads)
    assert said.startswith("Replace the loop at loss.py:3-5 with tensor ops") and \
        "(line 4 `t = x[i].item()`)" in said
    said = next_action("SLOW", VerdictFacts.of({"slow_by": None}), plain)
    assert "tensor ops" not in said and "per token" not in said and "host" not in said


def test_no_time_to_finish_a_forward_loop_is_claimed_while_the_process_is_in_backward():
    assert _loop_sentence(LOOP, "forward").endswith(
        "3.7/s: under a second to finish this loop (model.py:57)")
    assert ": about 3 min to finish this loop" in _loop_sentence({**LOOP, "eta_s": 173.0},
                                                                  "forward")
    # no heartbeat said which pass the process was in: no time to finish is claimed
    assert "to finish" not in _loop_sentence(LOOP, None)
    past = _loop_sentence(LOOP, "backward")
    assert "to finish" not in past
    assert past.endswith("at the kill the process was in backward, past this loop's forward "
                         "pass (model.py:57)")


def test_a_slow_runs_proof_speaks_of_steps_not_of_nsadiags_module_events():
    facts = {"slow_by": None, "steps_done": 93, "step_s": 0.25, "rate": 9.4,
             "fraction_done": 0.5}
    record = TrialRecord(spec={"command": ["python", "train.py"]}, evidence=None,
                         verdict=Verdict("SLOW", ["slow"], facts),
                         trial_dir="/nonexistent", wall_s=30.0)
    assert proof_of(record) == "93 steps done, the last in 0.25 s"
    assert verdict_sentence(record) == (
        "Still progressing when its time ran out at 4.0 steps/s (its last step's pace), 50% "
        "done: slow, not stuck (no hang).")
    # no finished step: no pace is claimed
    record.verdict.facts = VerdictFacts.of({"slow_by": None, "rate": 9.4})
    assert proof_of(record) == "still progressing at the kill"
    assert "/s" not in verdict_sentence(record)


def test_generated_code_is_never_the_users_own():
    assert not own_code(StackFrame("call", "/tmp/torchinductor_u/ab/cab12.py", 10))
    # inductor's module in a cache directory of the user's choice (TORCHINDUCTOR_CACHE_DIR)
    generated = "/scratch/ind/3f/c3fkedam5pdgpgt5jfukhhrnlt57ntbhqecjm3hbyrkahdlnuz72.py"
    assert not own_code(StackFrame("<module>", generated, 63))
    assert own_code(StackFrame("main", "/home/u/3f/c3f_train.py", 3))
    assert not own_code(StackFrame("kernel", "/home/u/.triton/cache/x/k.py", 3))
    assert own_code(StackFrame("main", "/home/u/train.py", 3))


def _crash(facts: dict, reasons: list[str], wall: float = 14.2) -> TrialRecord:
    return TrialRecord(spec={"command": ["torchrun", "train.py"]}, evidence=None,
                       verdict=Verdict("CRASH", reasons, facts),
                       trial_dir="/nonexistent", wall_s=wall)


def test_a_ranks_crash_names_its_signal_number_the_jobs_time_and_the_mismatch():
    met = ("rank 1's all_reduce #4 (4 bytes) from stat (train.py:32) met rank 0's DDP "
           "gradient all_reduce #4 (37,408 bytes, bucket 0): the ranks' collectives diverged "
           "at #4 (their sizes and kinds differ)")
    record = _crash({"rank": 1, "signal_name": "SIGABRT", "diverged_at": 4},
                    ["rank 1 died of SIGABRT", met])
    assert proof_of(record) == (f"rank 1 killed by SIGABRT (signal 6) in a job that ran 14 s, "
                                f"without a Python exception; {met}")
    said = next_action("CRASH", record.verdict.facts, None)
    assert said.startswith("Make every rank issue the same collectives in the same order")
    single = _crash({"signal": 11, "signal_name": "SIGSEGV", "wall_s": 3.0}, ["died"])
    assert proof_of(single) == "killed by SIGSEGV (signal 11) after 3.0 s, without a Python " \
                               "exception"
    assert "gdb" in next_action("CRASH", single.verdict.facts, None)


LEAK = """import torch


def main(model, val_x):
    history = []
    for step in range(100):
        losses = []
        val_loss = model(val_x).mean()
        losses.append(val_loss)
        history.append(val_loss)
        print(sum(v.item() for v in history))
"""


def _oom(script, facts: dict) -> TrialRecord:
    return TrialRecord(spec={"command": ["python", str(script)]}, evidence=None,
                       verdict=Verdict("OOM", ["the command raised MemoryError"], facts),
                       trial_dir="/nonexistent", wall_s=20.0)


def _retained(record: TrialRecord):
    return retain_culprit(record, carried_sources(
        record.evidence.source if record.evidence is not None else None))


def test_memory_that_grows_is_blamed_on_the_container_that_keeps_each_steps_tensor(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(LEAK)
    facts = {"rss_growth_per_step": 18 * 2**20, "rss_holder": "main (train.py:8)"}
    culprit = _retained(_oom(script, facts))
    # the list made anew in every pass keeps nothing across steps; `history` does
    assert culprit is not None and culprit.line == 10 and culprit.retains == "history"
    assert culprit.why.endswith("memory grew 18.0 MiB per step")
    # the same from what the record carries of the file (the holder's line named)
    stored = _oom(script, facts)
    stored.evidence = evidence_of(stored.spec, {"source": capture({"file": str(script),
                                                                   "line": 8})})
    assert _retained(stored) == culprit
    said = next_action("OOM", VerdictFacts.of(facts), culprit)
    assert said.startswith("Keep the value, not the tensor, in `history` at ")
    assert said.endswith("memory grew 18.0 MiB per step.")
    values = tmp_path / "values.py"  # the source is read once per file: another file
    values.write_text(LEAK.replace("history.append(val_loss)",
                                   "history.append(val_loss.item())"))
    kept = {**facts, "rss_holder": "main (values.py:8)"}
    assert _retained(_oom(values, kept)) is None  # keeps values: nothing to blame
    assert _retained(_oom(script, {"rss_holder": "main (train.py:8)"})) is None


def test_memory_that_grows_without_a_named_container_is_not_given_peak_advice():
    facts = {"rss_growth_per_step": 36 * 2**20, "rss_holder": "main (train.py:8)"}
    said = next_action("OOM", VerdictFacts.of(facts), None)
    assert said.startswith("Find what outlives each step: memory grew 36.0 MiB per step and "
                           "main (train.py:8) took it in step after step")
    assert "checkpointing" not in said
    # a peak, or a growth no frame was seen keeping: the peak advice
    assert "checkpointing" in next_action("OOM", VerdictFacts(), None)
    grew = VerdictFacts.of({"rss_growth_per_step": 2**20})
    assert "checkpointing" in next_action("OOM", grew, None)


def test_the_training_loop_is_never_the_slow_loop():
    # loss_token_loop.py: a per-token loop in the loss (reads each token on the host) inside
    # a training loop that prints the loss once per step: only the inner loop is a defect
    path = str(REPO / "repro" / "scripts" / "loss_token_loop.py")
    sources = Sources(live=True)
    lines = Path(path).read_text().splitlines()
    step = next(i for i, code in enumerate(lines, 1) if code.strip().startswith("for step "))
    inner = next(i for i, code in enumerate(lines, 1) if code.strip().startswith("for count "))
    assert training_loop(sources, path, sources.loop_around(path, step + 1))
    assert not training_loop(sources, path, sources.loop_around(path, inner + 1))
