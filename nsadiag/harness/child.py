"""The one child of every diagnosis: ``python -m nsadiag.harness.child JOB_JSON``.

The job (``nsadiag.spec.JobSpec``) says what to run: "trial" (train spec.steps steps,
nsadiag.harness.trial), "check" (one correctness check, nsadiag.checks), "memory" (the
memory probe's measurement) or "target" (import the target and check the spec's knobs
against its factory: nsadiag.harness.targetcheck). A ranked job (world_size > 1, or a DDP
trial of one rank) runs under torchrun and every rank runs the same job in
<out_dir>/rank-<r>/ after joining the process group; alone it runs in <out_dir>/.

In order, everything slow last: read the job (a bad job: one line on stderr, exit 2);
as a rank, die with the parent; arm faulthandler on SIGUSR1 (all threads, into
faulthandler.txt; fatal signals dump there too); open the heartbeat (events.jsonl) and
write the "start" event of phase "build" with the pid; start the progress sampler
(pulses, profile.json: nsadiag.probes.sampler); record the exceptions that end other
threads (thread-exceptions.jsonl: nsadiag.harness.thread_exceptions); import torch and
count module calls and autograd nodes (nsadiag.probes.counters); cap the address space
(RLIMIT_AS) when the spec sets memory_cap_bytes; seed torch and random; join the process
group as a rank; run the job; write result.json atomically.

result.json: status "ok" | "error", the job's measurements (a trial's Progress; a check's
finding also goes to check.json; the memory summary), peak_rss (ru_maxrss, bytes),
peak_cuda (max_memory_allocated or null), pid, rank, world_size, torch_threads,
exception {type, message, traceback} or null, oom (the exception is an allocation
failure). Exit 0 when the job ran, 1 when it raised (a rank then ends with os._exit: a
process group whose peer is gone can block the interpreter's shutdown), 2 for a bad job.

torch is imported after faulthandler is armed: importing it takes seconds, and a SIGUSR1
arriving before faulthandler.register would kill the child (the signal's default action)
instead of producing a stack dump.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import random
import resource
import signal
import sys
import traceback
from pathlib import Path
from typing import IO, Any

from nsadiag.harness import thread_exceptions
from nsadiag.harness.heartbeat import HeartbeatWriter, loaded_torch
from nsadiag.harness.rank import RankEnv, die_with_parent, rank_env
from nsadiag.harness.trial import Progress
from nsadiag.probes.counters import WorkCounters
from nsadiag.probes.sampler import Sampler
from nsadiag.ranknames import rank_names
from nsadiag.spec import JobSpec, TrialSpec

_dump_file: IO[str] | None = None  # open for the process lifetime: faulthandler writes it


def process_dir(job: JobSpec, rank: RankEnv | None) -> Path:
    """Where this process writes: the job directory, or its rank-<r>/ under torchrun."""
    base = Path(job.spec.out_dir)
    return base / f"rank-{rank.rank}" if rank is not None else base


def main(argv: list[str] | None = None) -> int:
    """Run the job of argv[0]; return the exit status (0 ran, 1 raised, 2 usage)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("nsadiag.harness.child: usage: python -m nsadiag.harness.child JOB_JSON",
              file=sys.stderr)
        return 2
    try:
        job = JobSpec.from_json(args[0])
        rank = rank_env() if job.ranked else None
        if job.ranked and rank is None:
            raise ValueError(f"world_size: {job.world_size} ranks need torchrun's RANK and "
                             f"WORLD_SIZE")
        directory = make_dir(process_dir(job, rank))
    except ValueError as exc:
        print(f"nsadiag.harness.child: {exc}", file=sys.stderr)
        return 2
    if rank is not None:
        die_with_parent()
    arm_faulthandler(directory / "faulthandler.txt")
    result = run(job, rank, directory)
    write_result(directory / "result.json", result)
    if result["status"] != "ok" and rank is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 0 if result["status"] == "ok" else 1


def make_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"out_dir: cannot create {str(path)!r}: {exc.strerror}") from None
    return path


def arm_faulthandler(path: Path) -> None:
    """SIGUSR1 -> all threads' Python stacks appended to `path`; fatal signals dump there too."""
    global _dump_file
    _dump_file = open(path, "a", encoding="utf-8")  # open for the process lifetime
    faulthandler.register(signal.SIGUSR1, file=_dump_file, all_threads=True, chain=False)
    faulthandler.enable(file=_dump_file, all_threads=True)


def run(job: JobSpec, rank: RankEnv | None, directory: Path) -> dict[str, Any]:
    """Set up, run the job, and describe what happened (every exception is caught)."""
    writer = HeartbeatWriter(directory / "events.jsonl", rank.rank if rank else None)
    writer.start("build", pid=os.getpid(), rank=rank.rank if rank else None,
                 job=job.kind, names=rank_names(os.environ).to_dict() if rank else None)
    counters = WorkCounters()
    sampler = Sampler(writer.pulse, directory / "profile.json", counters=counters,
                      context=writer.context, events=lambda: writer.events,
                      step=lambda: writer.step)
    sampler.start()
    thread_exceptions.install(directory / thread_exceptions.FILE_NAME)
    progress = Progress()
    measured: dict[str, Any] = {}
    error = None
    try:
        counters.install()  # imports torch
        cap_memory(job.spec.memory_cap_bytes)
        seed_everything(job.spec.seed)
        measured = run_job(job, rank, writer, directory, progress)
    except (Exception, SystemExit) as exc:  # recorded for the parent (MemoryError is an
        error = describe(exc)  # Exception too); the target's sys.exit() is not the child's
    finally:
        sampler.stop()
        counters.remove()
    status = "ok" if error is None else "error"
    writer.end(status)
    writer.close()
    return _result(status, {**progress.to_dict(), **measured}, error, rank)


def run_job(job: JobSpec, rank: RankEnv | None, writer: HeartbeatWriter, directory: Path,
            progress: Progress) -> dict[str, Any]:
    """The job itself: a trial's steps go to `progress` as they finish; returns the other
    measurements for result.json."""
    from nsadiag.harness.rank import init_process_group, shutdown
    from nsadiag.harness.times import pg_timeout_for

    spec = job.spec.replace(out_dir=str(directory))
    if rank is not None:
        timeout = job.pg_timeout_s or pg_timeout_for(spec.stall_timeout_s)
        init_process_group(job.ddp_backend, timeout, rank.local_rank)
        if job.ddp_backend == "nccl":
            from nsadiag.probes.flight_recorder import DumpOnRequest

            DumpOnRequest(directory, Path(job.spec.out_dir), rank.rank).start()
    finished = False
    try:
        measured = _run_kind(job, spec, rank, writer, directory, progress)
        finished = True
        return measured
    finally:
        if rank is not None:
            shutdown(finished)


def _run_kind(job: JobSpec, spec: TrialSpec, rank: RankEnv | None, writer: HeartbeatWriter,
              directory: Path, progress: Progress) -> dict[str, Any]:
    if job.kind == "trial":
        return _trial(spec, rank, writer, progress)
    if job.kind == "target":
        from nsadiag.targets import describe_target

        return {"target": describe_target(spec)}
    if job.kind == "check":
        check = importlib.import_module(f"nsadiag.checks.{job.check}")
        found = check.measure(spec, writer, rank) if job.check == "ddp" else \
            check.measure(spec, writer)
        if found is not None:
            if found.verdict.facts.check.layers is None:
                found.verdict.facts = found.verdict.facts.with_facts(
                    layers=writer.watched_blocks)
            (directory / "check.json").write_text(json.dumps(found.to_dict(), indent=1))
        return {}
    from nsadiag.harness.memory import measure_steps

    return {"memory": measure_steps(spec, None, job.top)}


def _trial(spec: TrialSpec, rank: RankEnv | None, writer: HeartbeatWriter,
           progress: Progress) -> dict[str, Any]:
    from nsadiag.harness.collectives import CollectiveCounter
    from nsadiag.harness.trial import train
    from nsadiag.targets import resolve

    collectives = CollectiveCounter(writer) if rank is not None else None
    if collectives is not None:
        collectives.install()
    try:
        train(spec, resolve(spec), writer, progress, rank, collectives)
    finally:
        if collectives is not None:
            collectives.remove()
    return {"collectives_issued": collectives.count} if collectives is not None else {}


def cap_memory(cap_bytes: int | None) -> None:
    """Soft RLIMIT_AS = cap (never above the hard limit). It limits virtual address space,
    so the cap must cover what torch has already mapped, not only the model."""
    if cap_bytes is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = cap_bytes if hard == resource.RLIM_INFINITY else min(cap_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


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


def _result(status: str, measured: dict[str, Any], error: dict[str, Any] | None,
            rank: RankEnv | None) -> dict[str, Any]:
    torch = loaded_torch()
    cuda = torch is not None and torch.cuda.is_initialized()
    result: dict[str, Any] = {"status": status, **measured}
    result.update({
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_cuda": torch.cuda.max_memory_allocated() if cuda else None,
        "pid": os.getpid(), "rank": rank.rank if rank else None,
        "world_size": rank.world_size if rank else 1,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "exception": None if error is None else
        {k: error[k] for k in ("type", "message", "traceback")},
        "oom": bool(error and error["oom"])})
    return result


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write JSON to `path` atomically: a reader sees the old file or the whole new one."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no temporary left behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


if __name__ == "__main__":
    sys.exit(main())
