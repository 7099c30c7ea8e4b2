"""A busy stall inside one native call under the user's line names that call: the regular
expression engine compiled into libpython is a native call, not the interpreter running
Python, and its Next is about the pattern; another native call gets its own."""

from __future__ import annotations

import json
import sys
import textwrap

from nsadiag.evidence import StackFrame, StackSample, ThreadStack
from nsadiag.finding.trial import native_next
from nsadiag.probes.frames import classify, native_call
from tests.helpers import checkout_env, nsadiag

LIBPYTHON = "/usr/lib/libpython3.11.so.1.0"


def _sample(t: float, cpu: float, native: str) -> StackSample:
    frames = [StackFrame("sre_ucs1_match", LIBPYTHON, 0, is_native=True),
              StackFrame(native, LIBPYTHON, 0, is_native=True),
              StackFrame("clean", "/home/u/data.py", 5, code="if PATTERN.fullmatch(text):"),
              StackFrame("<module>", "/home/u/data.py", 12)]
    return StackSample(t, 100, [ThreadStack(100, "MainThread", frames, os_thread_id=100,
                                            active=True)], native=True, cpu_seconds=cpu)


def test_the_regex_engine_under_a_user_line_is_a_native_call():
    samples = [_sample(0.0, 0.0, "_sre_SRE_Pattern_fullmatch"),
               _sample(1.0, 0.97, "_sre_SRE_Pattern_fullmatch")]
    assert classify(samples) == "busy-native"
    assert native_call(samples) == "_sre_SRE_Pattern_fullmatch"
    interpreted = [_sample(0.0, 0.0, "_PyEval_EvalFrameDefault"),
                   _sample(1.0, 0.97, "_PyEval_EvalFrameDefault")]
    assert classify(interpreted) == "busy-python"


def test_the_next_of_a_native_call_is_about_that_call():
    said = native_next("_sre_SRE_Pattern_fullmatch", None, " at data.py:5")
    assert said.startswith("The call at data.py:5 did not return while it was watched")
    assert "nested repetition" in said and "`timeout=`" in said
    other = native_next("at::native::cpu_kernel", None, " at model.py:40")
    assert "regular expression" not in other and "Run it alone" in other


BACKTRACKS = textwrap.dedent("""
    import re
    import torch
    PATTERN = re.compile(r"^(\\w+\\s?)*$")

    def clean(text):
        return text.lower() if PATTERN.fullmatch(text) else ""

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    for line in ["a short line", "another line", "x" * 40 + "!"]:
        model(torch.randn(2, 4)).sum().backward(); opt.step()
        clean(line)
""")


def test_a_regex_that_backtracks_is_named_at_its_call(tmp_path):
    script = tmp_path / "clean.py"
    script.write_text(BACKTRACKS)
    out = tmp_path / "run"
    done = nsadiag("run", "--stall-timeout", "5", "--out", str(out), "--", sys.executable,
                   str(script), env=checkout_env())
    assert done.returncode == 1, done.stderr
    finding = json.loads((out / "summary.json").read_text())["finding"]
    assert finding["verdict"] == "STALL-BUSY"
    assert finding["culprit"]["where"] == "clean.py:7"
    assert "`_sre_SRE_Pattern_fullmatch`" in finding["next_action"]
    assert "nested repetition" in finding["next_action"]
