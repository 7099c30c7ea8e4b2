"""A stall inside torch.compile's compiler, said as such (pure).

Compiling is progress: while a process's main thread is in the compiler, the CPU time of
that thread and of the processes below it (compile workers, the C++ compiler) holds the
stall clock for up to COMPILE_BOUND_S of one compile (nsadiag.probes.compiler, read by the
progress sampler). A stall declared while the stacks still show the compiler therefore
means the compile did no work for the whole stall window (nothing ran in this process or
below it: a wait that nothing will answer) or kept busy past that bound. ``compile_stall``
finds that in the stall's stack samples, and ``add_compile_stall`` names the compiler's
frames in the verdict, so the report says the compile is what is stuck instead of blaming
the user's code or a lock of theirs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nsadiag.evidence import StackFrame, StackSample
from nsadiag.probes.compiler import COMPILE_BOUND_S, compiler_frame


@dataclass(frozen=True)
class CompileStall:
    """Where the compiler stood in a stall's samples: its entry frame (the outermost
    compiler frame) and the innermost Python frame below it, in the last sample that
    showed it, and in how many of the samples a thread was compiling."""

    entry: str
    innermost: str
    in_compiler: int
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "innermost": self.innermost,
                "in_compiler": self.in_compiler, "samples": self.samples}


def _where(frame: StackFrame) -> str:
    return f"{frame.function} ({frame.file}:{frame.line})"


def compile_stall(samples: Sequence[StackSample]) -> CompileStall | None:
    """The compile a stall's samples show (see the module docstring); None when no sample
    has a thread in the compiler."""
    found: tuple[StackFrame, StackFrame] | None = None
    in_compiler = 0
    for sample in samples:
        for thread in sample.threads:
            frames = thread.python_frames()  # innermost first
            entry = compiler_frame((f.function, f.file, f.line) for f in reversed(frames))
            if entry is None:
                continue
            in_compiler += 1
            at = next(f for f in frames if (f.function, f.file, f.line) == entry)
            found = (at, frames[0])
            break
    if found is None:
        return None
    return CompileStall(_where(found[0]), _where(found[1]), in_compiler, len(samples))


def add_compile_stall(samples: Sequence[StackSample], facts: dict[str, Any],
                      reasons: list[str]) -> None:
    """Facts and a sentence for a stall inside the compiler; nothing otherwise."""
    found = compile_stall(samples)
    if found is None:
        return
    facts["compiling"] = found.to_dict()
    reasons.append(
        f"the stall is inside torch.compile: {found.in_compiler} of {found.samples} stack "
        f"samples show the compiler, entered at {found.entry}, innermost at "
        f"{found.innermost}; a compile that works (in this process or in its compile "
        f"workers and C++ compiler) counts as progress for up to "
        f"{COMPILE_BOUND_S / 60:.0f} min, so this compile did no work for the stall window "
        f"or ran past that bound: the compile is what is stuck")
