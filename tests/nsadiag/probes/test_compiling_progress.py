"""Compiling is progress: a main thread in torch.compile's compiler whose helper processes
work is progressing, one whose compile does nothing is not, and a stall inside the
compiler is said to be the compile's, with the compiler's frames."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from nsadiag.evidence import StackFrame, StackSample, StallEvidence, ThreadStack
from nsadiag.probes.compiler import compiler_frame, descendants_cpu_s
from nsadiag.probes.sampler import Sampler
from nsadiag.verdict.stall import classify_stall
from tests.helpers import nsadiag

TORCH = "/venv/lib/python3.11/site-packages/torch"
RUNNING_COMPILED = [("<module>", "/u/train.py", 40), ("_fn", f"{TORCH}/_dynamo/eval_frame.py", 655),
                    ("forward", "/u/model.py", 12)]
COMPILING = [("<module>", "/u/train.py", 40), ("_fn", f"{TORCH}/_dynamo/eval_frame.py", 655),
             ("__call__", f"{TORCH}/_dynamo/convert_frame.py", 1432),
             ("compile_fx_inner", f"{TORCH}/_inductor/compile_fx.py", 700),
             ("wait", f"{TORCH}/_inductor/async_compile.py", 470),
             ("result", "/usr/lib/python3.11/concurrent/futures/_base.py", 451)]


def test_the_compiler_is_its_entry_points_not_the_compiled_models_wrappers():
    assert compiler_frame(RUNNING_COMPILED) is None
    assert compiler_frame(COMPILING) == COMPILING[2]
    backward_compile = [("backward", "/u/train.py", 41),
                        ("compile_fx", f"{TORCH}/_inductor/compile_fx.py", 2100)]
    assert compiler_frame(backward_compile) == backward_compile[1]


def test_the_cpu_of_processes_below_this_one_is_counted():
    before = descendants_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        deadline = time.monotonic() + 60
        # 0.3 s of the child's CPU, then at least 0.2 s counted after the reap: the counts
        # come in clock ticks, and 354.6 - 354.5 is 0.0999... in floating point
        while descendants_cpu_s() - before < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert descendants_cpu_s() - before >= 0.3
    finally:
        child.kill()
        child.wait()
    assert descendants_cpu_s() - before >= 0.2  # reaped: its time stays counted


def _fake_compiler(root: Path) -> dict:
    """A module whose file lies where Inductor's graph compilation does, waiting on a
    child process the way the compiler waits on its workers and the C++ compiler."""
    source = root / "torch" / "_inductor" / "compile_fx.py"
    source.parent.mkdir(parents=True)
    source.write_text(textwrap.dedent("""
        import subprocess, sys
        def compile_fx_inner(code, started):
            child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
            child.stdout.readline()  # the child started: what it costs is not the test's
            started.set()
            child.wait()
        """))
    namespace: dict = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("busy", [True, False])
def test_a_compile_whose_helpers_work_is_progress_and_one_that_waits_is_not(tmp_path, busy):
    compile_fx = _fake_compiler(tmp_path)["compile_fx_inner"]
    code = ("import time\nprint(flush=True)\nend = time.monotonic() + 6\n"
            "while time.monotonic() < end: pass" if busy
            else "import time\nprint(flush=True)\ntime.sleep(6)")
    started = threading.Event()
    thread = threading.Thread(target=compile_fx, args=(code, started), daemon=True)
    thread.start()
    assert started.wait(30)
    pulses: list[dict] = []
    sampler = Sampler(pulses.append, None, interval_s=0.05, pulse_s=1.0, main=thread)
    sampler.start()
    try:
        thread.join(60)
    finally:
        sampler.stop()
    compiling = [pulse for pulse in pulses if pulse["compiling_s"] is not None]
    assert len(compiling) >= 3
    assert all("compile_fx_inner" in pulse["compiler"] for pulse in compiling)
    # the first pulse of a compile has nothing to compare; the same stack ever after
    progressed = [pulse["progress"] for pulse in compiling[1:]]
    assert any(progressed) if busy else not any(progressed[1:])


def _sample(t: float, frames: list[tuple[str, str, int]]) -> StackSample:
    thread = ThreadStack(thread_id=1, name="MainThread", active=False, frames=[
        StackFrame(function=f, file=file, line=line) for f, file, line in reversed(frames)])
    return StackSample(t=t, pid=10, threads=[thread])


def test_a_stall_inside_the_compiler_names_the_compile_and_its_frames():
    samples = [_sample(float(i), COMPILING) for i in range(3)]
    stall = StallEvidence(since_last_event_s=30.0, window_s=30.0, cpu_delta_s=0.1,
                          samples=samples, main_cpu_delta_s=0.05, runq_delta_s=0.0)
    verdict = classify_stall(stall)
    assert verdict.name == "DEADLOCK"  # nothing worked: the compile waits on nothing
    facts = verdict.facts.stall.compiling
    assert facts["in_compiler"] == 3 and facts["samples"] == 3
    assert facts["entry"].startswith("__call__ (") and "convert_frame.py:1432" in facts["entry"]
    assert facts["innermost"].startswith("result (")
    assert any(reason.startswith("the stall is inside torch.compile: 3 of 3 stack samples")
               for reason in verdict.reasons)
    plain = classify_stall(StallEvidence(
        since_last_event_s=30.0, window_s=30.0, cpu_delta_s=0.1,
        samples=[_sample(float(i), RUNNING_COMPILED) for i in range(3)]))
    assert plain.facts.stall.compiling is None
    assert not any("torch.compile" in reason for reason in plain.reasons)


RECOMPILING = textwrap.dedent("""
    import torch
    from torch import nn
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.compile(nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 1)),
                          dynamic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, length in enumerate((3, 5, 7)):  # a new sequence length: a recompile each step
        loss = model(torch.randn(length, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print("step", step, flush=True)
    """)


@pytest.mark.slow
def test_a_model_recompiled_at_every_step_is_ok_under_a_short_stall_timeout(tmp_path):
    # inductor, as users run it: each step compiles a forward and a backward graph (the C++
    # compiler runs for seconds, longer than the stall timeout on a loaded machine)
    script = tmp_path / "recompile.py"
    script.write_text(RECOMPILING)
    done = nsadiag("run", "--stall-timeout", "4", "--out", str(tmp_path / "runs"), "--",
                   sys.executable, str(script), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step 2" in done.stdout
