"""The trial child: `python -m nsadiag.trial SPEC_JSON`.

In order: read and validate the spec (a bad spec: one line on stderr, exit 2); register
faulthandler on SIGUSR1 (all threads, into <out_dir>/faulthandler.txt; fatal signals are
dumped there too); write the "start" event of phase "build"; import torch; cap the address
space with RLIMIT_AS when memory_cap_bytes is set; seed torch and random; resolve the
target; run `steps` steps of forward,
backward and AdamW on random token ids [batch, seq_len + 1] (next-token cross entropy,
under bf16 autocast when dtype is bfloat16), writing heartbeat events to
<out_dir>/events.jsonl; then write <out_dir>/result.json atomically (tmp + os.replace).

result.json: status "ok" | "error", steps_done, step_s / forward_s / backward_s / loss (one
per finished step), peak_rss (ru_maxrss, bytes), peak_cuda (max_memory_allocated or null),
expected_events_per_step (module events of step 0; null if step 0 did not finish),
saved_bytes and saved_by_branch (bytes saved for backward by step 0's forward, in all and
inside each NSA branch cmp/sel/win/select; null until that forward finished),
exception {type, message, traceback} or null, oom (the exception is an allocation failure:
MemoryError, torch.OutOfMemoryError, or the CPU allocator's "can't allocate memory").
Exit 0 when every step ran, 1 when an exception (MemoryError included) was recorded.
Phase timings synchronise CUDA at phase boundaries (never inside hooks).

torch (and everything importing it) is imported inside the functions that use it, after
faulthandler is armed: importing torch takes seconds, and a SIGUSR1 arriving before
faulthandler.register would kill the child (the signal's default action) instead of
producing a stack dump. A bad spec is refused without importing torch at all. The memory
cap is applied after the import, so a cap too small fails on an allocation that is
recorded, not inside the dynamic loader.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import random
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from nsadiag.heartbeat import HeartbeatWriter, loaded_torch
from nsadiag.spec import TrialSpec

if TYPE_CHECKING:
    import torch

    from nsadiag.targets import Target

LEARNING_RATE = 1e-3
_dump_file: IO[str] | None = None  # kept open for the process lifetime: faulthandler writes it


@dataclass
class Progress:
    """What the finished steps measured."""

    step_s: list[float] = field(default_factory=list)
    forward_s: list[float] = field(default_factory=list)
    backward_s: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    expected_events_per_step: int | None = None
    saved_bytes: int | None = None  # saved for backward by step 0's forward
    saved_by_branch: dict[str, int] | None = None  # the same, inside each NSA branch


class BranchTee:
    """The branch events of the heartbeat's BranchProbe, written as heartbeat events and
    passed on to the saved-tensor ledger while one is counting (step 0's forward), so the
    ledger attributes to cmp/sel/win without wrapping the branch functions a second time."""

    def __init__(self, writer: HeartbeatWriter):
        self.writer = writer
        self.ledger: Any = None

    def __call__(self, name: str, phase: str, edge: str) -> None:
        self.writer.module(name, phase, edge)
        if self.ledger is not None:
            self.ledger.branch_event(name, phase, edge)


def main(argv: list[str] | None = None) -> int:
    """Run the trial described by argv[0]; return the exit status (0 ok, 1 error, 2 usage)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("nsadiag.trial: usage: python -m nsadiag.trial SPEC_JSON", file=sys.stderr)
        return 2
    try:
        spec = TrialSpec.from_json(args[0])
        out_dir = _make_dir(spec.out_dir)
    except ValueError as exc:
        print(f"nsadiag.trial: {exc}", file=sys.stderr)
        return 2
    arm_faulthandler(out_dir / "faulthandler.txt")
    result = run(spec, out_dir)
    write_result(out_dir / "result.json", result)
    return 0 if result["status"] == "ok" else 1


def _make_dir(path: str) -> Path:
    out_dir = Path(path)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"out_dir: cannot create {path!r}: {exc.strerror}") from None
    return out_dir


def arm_faulthandler(path: Path) -> None:
    """SIGUSR1 -> all threads' Python stacks appended to `path`; fatal signals dump there too."""
    global _dump_file
    _dump_file = open(path, "a", encoding="utf-8")  # open for the process lifetime
    faulthandler.register(signal.SIGUSR1, file=_dump_file, all_threads=True, chain=False)
    faulthandler.enable(file=_dump_file, all_threads=True)


def cap_memory(cap_bytes: int | None) -> None:
    """Soft RLIMIT_AS = cap (never above the hard limit). It limits virtual address space,
    so the cap must cover what torch has already mapped, not only the model."""
    if cap_bytes is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = cap_bytes if hard == resource.RLIM_INFINITY else min(cap_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def run(spec: TrialSpec, out_dir: Path) -> dict[str, Any]:
    """Build and train; every exception is caught and described in the returned result."""
    writer = HeartbeatWriter(out_dir / "events.jsonl")
    writer.start("build")
    progress = Progress()
    error = None
    try:
        from nsadiag.targets import resolve

        cap_memory(spec.memory_cap_bytes)
        seed_everything(spec.seed)
        train(spec, resolve(spec), writer, progress)
    except Exception as exc:  # recorded for the parent; MemoryError is an Exception too
        error = describe(exc)
    # the frames of a failed build/step are gone now, so their tensors are freed
    status = "ok" if error is None else "error"
    writer.end(status)
    writer.close()
    return _result(status, progress, error)


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def train(spec: TrialSpec, target: Target, writer: HeartbeatWriter, progress: Progress) -> None:
    """`spec.steps` steps of forward, backward, AdamW; measurements go to `progress`."""
    import torch

    from nsadiag.heartbeat import watch

    device = _device_of(target)
    optimizer = torch.optim.AdamW(target.model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(spec.seed)
    tee = BranchTee(writer)
    with watch(target, writer, tee):
        for step in range(spec.steps):
            ids = torch.randint(target.vocab_size, (spec.batch, spec.seq_len + 1),
                                generator=generator).to(device)
            before = writer.module_events
            run_step(spec, target, optimizer, ids, step, writer, progress, tee)
            if step == 0:
                progress.expected_events_per_step = writer.module_events - before


def run_step(spec: TrialSpec, target: Target, optimizer: torch.optim.Optimizer,
             ids: torch.Tensor, step: int, writer: HeartbeatWriter,
             progress: Progress, tee: BranchTee | None = None) -> None:
    """One step, with a "start" event per phase and a "step" event at its end. Step 0's
    forward runs under the saved-tensor ledger, fed branch events by `tee`."""
    import torch

    from nsadiag.probes.memory import SavedTensorLedger

    device = ids.device
    writer.start("forward", step)
    # the heartbeat's branch wrappers are installed already: the tee feeds their events
    ledger = SavedTensorLedger(target.model, branches=False) if step == 0 else None
    saving = ledger if ledger else contextlib.nullcontext()
    if tee is not None:
        tee.ledger = ledger
    t0 = time.perf_counter()
    try:
        with saving, torch.autocast(device.type, dtype=torch.bfloat16,
                                    enabled=spec.dtype == "bfloat16"):
            loss = target.loss(ids)
    finally:
        if tee is not None:
            tee.ledger = None
    t1 = _synced_time(device)
    saved = {}
    if ledger:
        progress.saved_bytes = ledger.total
        progress.saved_by_branch = ledger.by_branch()
        saved = {"saved_bytes": ledger.total, "saved_by_branch": progress.saved_by_branch}
    writer.start("backward", step, **saved)
    loss.backward()
    t2 = _synced_time(device)
    writer.start("optimizer", step)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t3 = _synced_time(device)
    writer.step_done(step_s=t3 - t0, forward_s=t1 - t0, backward_s=t2 - t1)
    progress.step_s.append(t3 - t0)
    progress.forward_s.append(t1 - t0)
    progress.backward_s.append(t2 - t1)
    progress.loss.append(float(loss.detach()))


def _device_of(target: Target) -> torch.device:
    import torch

    parameter = next(target.model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _synced_time(device: torch.device) -> float:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def describe(exc: BaseException) -> dict[str, Any]:
    """{type, message, traceback, oom} of an exception, as plain JSON values."""
    return {"type": type(exc).__name__, "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            "oom": is_oom(exc)}


def is_oom(exc: BaseException) -> bool:
    """An allocation failure: Python's MemoryError, CUDA OOM, or the CPU allocator's
    RuntimeError (RLIMIT_AS or an exhausted machine). Works without torch imported."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def _result(status: str, progress: Progress, error: dict[str, Any] | None) -> dict[str, Any]:
    torch = loaded_torch()
    cuda = torch is not None and torch.cuda.is_initialized()
    peak_cuda = torch.cuda.max_memory_allocated() if cuda else None
    exception = None if error is None else {k: error[k] for k in ("type", "message", "traceback")}
    return {"status": status, "steps_done": len(progress.step_s), "step_s": progress.step_s,
            "forward_s": progress.forward_s, "backward_s": progress.backward_s,
            "loss": progress.loss,
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_cuda": peak_cuda,
            "expected_events_per_step": progress.expected_events_per_step,
            "saved_bytes": progress.saved_bytes,
            "saved_by_branch": progress.saved_by_branch,
            "exception": exception, "oom": bool(error and error["oom"])}


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write JSON to `path` atomically: a reader sees the old file or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
