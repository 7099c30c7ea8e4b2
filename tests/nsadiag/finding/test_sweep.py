"""The findings of a sweep (nsadiag.finding.sweep) from hand-built rows and records: each
trial as one line with its mark, how the peak's parts grew, where a fitted peak reaches
this machine's memory (the cliff), and the finding of a layer sweep: its first failure,
or every depth OK."""

import pytest

from nsadiag.finding.sweep import (
    SweepFacts,
    analyse_seq,
    cliff_sentence,
    crossing,
    decide_sweep,
    growth_items,
    measure_layer_sweep,
    row_item,
)
from nsadiag.sweep import SweepRow
from nsadiag.verdict.thresholds import FASTER_THAN_SAVED
from tests.helpers import plain_spec, trial_record

GIB = 2**30


def row(n_layers: int, verdict: str, **measured) -> SweepRow:
    return SweepRow(label="sweep-layers", n_layers=n_layers, verdict=verdict, forward_s=None,
                    backward_s=None, step_s=measured.pop("step_s", None),
                    peak_rss=measured.pop("peak_rss", None),
                    saved_bytes=measured.pop("saved_bytes", None), steps_done=2,
                    trial_dir=f"trial-{n_layers}", **measured)


def test_each_trial_is_one_line_marked_by_what_its_verdict_means():
    fine = row_item(row(4, "OK", step_s=1.234, peak_rss=2 * GIB))
    assert (fine.mark, fine.text) == ("ok", "4 layers: OK, step 1.2 s, peak 2.00 GiB")
    stuck = row_item(row(1, "DEADLOCK"))
    assert (stuck.mark, stuck.text) == ("fail", "1 layer: DEADLOCK")
    unsure = row_item(row(2, "INCONCLUSIVE", step_s=3.0))
    assert (unsure.mark, unsure.text) == ("warn", "2 layers: INCONCLUSIVE, step 3.0 s")
    by_seq = row_item(row(2, "OK", seq_len=512), unit="S")
    assert by_seq.text == "S=512: OK"


def test_a_peak_outgrowing_the_saved_bytes_is_implicated_and_one_keeping_pace_ruled_out():
    outgrows = {"from": 1, "to": 4, "saved": 2.0, "rest": 8.0, "outgrows": True}
    ruled_out, implicated = growth_items(outgrows)
    assert ruled_out == []
    assert implicated[0].mark == "fail" and implicated[0].text.startswith(
        "The peak outgrows what is saved for backward: from 1 to 4 layers the rest of the "
        "peak grew 8.0x, the saved bytes 2.0x")
    ruled_out, implicated = growth_items({**outgrows, "rest": 2.5, "outgrows": False},
                                         per="tokens")
    assert implicated == [] and ruled_out[0].text == (
        "A peak outgrowing the activations: from 1 to 4 tokens the saved bytes grew 2.0x, "
        "the rest of the peak 2.5x.")
    assert growth_items(None) == ([], [])


def test_the_cliff_is_where_the_fitted_line_or_parabola_reaches_the_memory():
    # y = 1000 x reaches 10,500 at x = 10.5; y = x^2 reaches 110.25 at x = 10.5: at 10 the
    # fit is still below the memory, so 11 is the first size that runs out
    assert crossing([1, 2, 3], [1000.0, 2000.0, 3000.0], False, 10_500) == 11
    assert crossing([1, 2, 3, 4], [1.0, 4.0, 9.0, 16.0], True, 110.25) == 11
    # a fit that reaches the memory exactly at a whole size runs out at that size
    assert crossing([1, 2, 3], [1000.0, 2000.0, 3000.0], False, 10_000) == 10
    assert crossing([1, 2, 3, 4], [1.0, 4.0, 9.0, 16.0], True, 100.0) == 10
    assert crossing([1, 2, 3], [3000.0, 2000.0, 1000.0], False, 10_500) is None


def test_the_cliff_sentence_gives_the_predicted_peaks_and_the_point_the_memory_runs_out():
    facts = SweepFacts(predicted={2048: 4 * GIB, 4096: 8 * GIB}, cliff=3072, memory=6 * GIB)
    assert cliff_sentence(facts) == ("Predicted peak 4.00 GiB at S=2,048, 8.00 GiB at "
                                     "S=4,096: this machine's 6.00 GiB run out near S=3,072.")
    within = SweepFacts(predicted={2048: 4 * GIB}, memory=64 * GIB)
    assert cliff_sentence(within) == ("Predicted peak 4.00 GiB at S=2,048, within this "
                                      "machine's 64.0 GiB.")
    assert cliff_sentence(SweepFacts()) is None


def test_a_sweep_over_s_fits_the_peak_and_finds_the_cliff_and_the_growth():
    # peak = 1 GiB + 1 MiB per token; saved bytes double with S, the rest grows faster
    rows = [row(2, "OK", seq_len=s, step_s=0.001 * s, peak_rss=GIB + s * 2**20,
                saved_bytes=s * 2**10) for s in (256, 512, 1024)]
    facts = analyse_seq(rows, memory=4 * GIB)
    assert facts.cliff == 3 * 1024  # 1 GiB + S MiB reaches 4 GiB at S = 3,072
    assert sorted(facts.predicted) == [2048, 4096]
    assert facts.predicted[2048] == pytest.approx(GIB + 2048 * 2**20)
    rest = [GIB + s * 2**20 - s * 2**10 for s in (256, 1024)]
    assert facts.growth["saved"] == pytest.approx(4.0)
    assert facts.growth["rest"] == pytest.approx(rest[1] / rest[0])
    assert facts.growth["outgrows"] is (rest[1] / rest[0] > FASTER_THAN_SAVED * 4.0)


def layer_records(verdicts: dict[int, str]) -> list:
    return [trial_record(plain_spec(n), {"status": "ok", "steps_done": 2,
                                         "step_s": [2.0, 0.5 * n, 0.5 * n],
                                         "peak_rss": GIB + n * 2**28}
                         if verdict == "OK" else None, verdict, f"trial-{n}",
                         reasons=[f"{verdict} at {n} layers"])
            for n, verdict in verdicts.items()]


def test_a_layer_sweep_fails_at_its_first_failure_with_a_command_to_reproduce_it():
    measured = measure_layer_sweep(
        layer_records({4: "DEADLOCK", 1: "OK", 2: "OK", 8: "CRASH"}), {}, "sweep-layers",
        memory=64 * GIB)
    assert measured.failing.trial_dir == "trial-4"
    finding = decide_sweep(measured)
    assert finding.verdict == "DEADLOCK" and finding.status == "failure"
    assert finding.headline.startswith("DEADLOCK (stuck) at 4 layers")
    assert finding.subject == "nsa, layers 1-8, S=64"
    assert "Reproduce it alone: `" in finding.next_action
    assert [item.text for item in finding.results] == [
        "1 layer: OK, step 0.50 s, peak 1.25 GiB", "2 layers: OK, step 1.0 s, peak 1.50 GiB",
        "4 layers: DEADLOCK", "8 layers: CRASH"]
    assert finding.ruled_out[0].text == "A failure at 2 layers or less: 2 trial(s) finished " \
                                        "every step."


def test_a_layer_sweep_with_every_depth_ok_is_healthy():
    measured = measure_layer_sweep(layer_records({1: "OK", 2: "OK", 3: "OK"}), {},
                                   "sweep-layers", memory=64 * GIB)
    assert measured.failing is None
    finding = decide_sweep(measured)
    assert (finding.verdict, finding.status) == ("OK", "healthy")
    assert finding.headline == "OK (healthy): every trial OK up to 3 layers"
    assert finding.proof.startswith("step time 0.50 s per layer")
