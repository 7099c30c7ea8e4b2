"""A stall inside torch.compile's compiler said as such (nsadiag.verdict.compiling), on
hand-built stack samples: the compiler's entry frame (the outermost one) and the innermost
frame below it, in how many samples a thread compiled, and nothing for a stall elsewhere."""

from nsadiag.evidence import StackFrame, StackSample, ThreadStack
from nsadiag.probes.compiler import COMPILE_BOUND_S
from nsadiag.verdict.compiling import add_compile_stall, compile_stall

TORCH = "/venv/lib/python3.11/site-packages/torch"
# innermost first, as py-spy prints them: a compile waiting on its workers, entered from
# dynamo's convert_frame (outermost compiler frame) below inductor's compile_fx
COMPILING = [StackFrame("result", "/usr/lib/python3.11/concurrent/futures/_base.py", 451),
             StackFrame("compile_fx_inner", f"{TORCH}/_inductor/compile_fx.py", 700),
             StackFrame("_compile", f"{TORCH}/_dynamo/convert_frame.py", 980),
             StackFrame("__call__", f"{TORCH}/_dynamo/convert_frame.py", 1200),
             StackFrame("train_step", "/home/user/project/train.py", 30)]
TRAINING = [StackFrame("forward", "/home/user/project/model.py", 57),
            StackFrame("train_step", "/home/user/project/train.py", 30)]


def sample(t: float, *stacks: list[StackFrame]) -> StackSample:
    return StackSample(t, 900, [ThreadStack(i + 1, "MainThread" if i == 0 else f"t{i}", frames)
                                for i, frames in enumerate(stacks)])


def test_the_compile_is_named_by_its_outermost_entry_and_its_innermost_frame():
    found = compile_stall([sample(1.0, TRAINING), sample(2.0, COMPILING),
                           sample(3.0, TRAINING, COMPILING)])
    assert found.entry == f"__call__ ({TORCH}/_dynamo/convert_frame.py:1200)"
    assert found.innermost == "result (/usr/lib/python3.11/concurrent/futures/_base.py:451)"
    assert (found.in_compiler, found.samples) == (2, 3)


def test_the_verdict_says_the_compile_is_what_is_stuck():
    reasons: list[str] = []
    add_compile_stall([sample(1.0, COMPILING), sample(2.0, COMPILING)], {}, reasons)
    assert len(reasons) == 1
    assert reasons[0].startswith(
        f"the stall is inside torch.compile: 2 of 2 stack samples show the compiler, entered "
        f"at __call__ ({TORCH}/_dynamo/convert_frame.py:1200), innermost at result ")
    assert f"counts as progress for up to {COMPILE_BOUND_S / 60:.0f} min" in reasons[0]
    assert reasons[0].endswith("the compile is what is stuck")


def test_a_stall_outside_the_compiler_adds_nothing():
    reasons: list[str] = []
    assert compile_stall([sample(1.0, TRAINING)]) is None
    assert compile_stall([]) is None
    add_compile_stall([sample(1.0, TRAINING)], {}, reasons)
    assert reasons == []
