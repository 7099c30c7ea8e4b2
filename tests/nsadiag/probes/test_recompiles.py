"""The compile records a watched process reports (nsadiag.probes.recompiles): each compile
once, a recompile with the guard that failed, and nothing that was not a frame's compile."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from nsadiag.probes.recompiles import CompileWatch, compile_fields


def test_each_compile_is_reported_once_with_the_guard_of_each_recompile():
    torch._dynamo.reset()
    emitted: list[dict] = []
    watch = CompileWatch(emitted.append)
    watch.poll()
    emitted.clear()  # what this process compiled before the test is not this test's
    compiled = torch.compile(torch.nn.Linear(4, 4), dynamic=False, backend="eager")
    for length in (3, 5, 7):
        compiled(torch.randn(length, 4))
    assert watch.poll() == 3 and watch.poll() == 0
    reasons = [event["recompile_reason"] for event in emitted]
    assert reasons[0] is None  # the first compile is no recompile
    assert reasons[1].endswith("size mismatch at index 0. expected 3, actual 5"), reasons
    assert reasons[2].endswith("size mismatch at index 0. expected 5, actual 7"), reasons
    assert len({event["compile_id"] for event in emitted}) == 3


def test_a_record_of_no_frames_compile_is_not_reported():
    runtime = SimpleNamespace(is_runtime=True, co_name="forward", compile_id="0/0")
    unnamed = SimpleNamespace(is_runtime=False, co_name=None, compile_id="0/1")
    assert compile_fields(runtime) is None and compile_fields(unnamed) is None
    verbose = SimpleNamespace(is_runtime=False, co_name="f", co_filename="/u/m.py",
                              co_firstlineno=3, compile_id="1/2",
                              recompile_reason="0/1: x == 2\n  guard source: ...")
    assert compile_fields(verbose) == {"compile_id": "1/2", "function": "f", "file": "/u/m.py",
                                       "line": 3, "recompile_reason": "0/1: x == 2"}
