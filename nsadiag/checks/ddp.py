"""ddp: N-rank DistributedDataParallel gradients against one process on the same batch.

Launches `torchrun --standalone --nproc_per_node N -m nsadiag.checks.ddp_worker` (gloo on
the CPU, nccl on CUDA) from the check child; see ddp_worker for what each rank computes.
The ranks' heartbeat events are relayed into the check's own heartbeat ("rank1.blocks.0"),
so the watching runner sees progress and stalls of the ranks. The process group times out
after half the stall timeout (5 s at least, 30 s at most): a rank stuck in a collective
fails with that error before the runner's silence limit. torchrun runs in the check
child's process group, and every process it started is killed when the check ends,
whichever way. A rank that raised ends the check with its exception (type and message),
which the runner reports as ERROR; e.g. "Expected to mark a variable ready only once" for
the late-bound checkpoint closure with reentrant checkpointing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from nsadiag.checks import TOLERANCE, CheckResult, finding
from nsadiag.heartbeat import HeartbeatWriter
from nsadiag.runner import EventTail
from nsadiag.spec import TrialSpec

WORLD_SIZE = 2
POLL_S = 0.2


def pg_timeout_s(spec: TrialSpec) -> float:
    return min(30.0, max(5.0, spec.stall_timeout_s / 2))


def measure(spec: TrialSpec, writer: HeartbeatWriter, world_size: int = WORLD_SIZE) -> CheckResult:
    if world_size < 2:
        raise ValueError(f"world_size: the ddp check needs at least 2 ranks, got {world_size}")
    out = Path(spec.out_dir) / "ranks"
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(spec.to_json())
    returncode = launch(spec, world_size, spec_path, out, writer)
    errors = sorted(out.glob("rank*.error.json"))
    if errors:
        error = json.loads(errors[0].read_text())
        raise RuntimeError(f"{errors[0].name.split('.')[0]}: {error['type']}: {error['message']}")
    if returncode != 0 or not (out / "ddp.json").exists():
        log = (out / "torchrun.txt").read_text(errors="replace").strip().splitlines()
        raise RuntimeError(f"torchrun exited with {returncode}: "
                           f"{log[-1] if log else 'no output'}")
    return judge(json.loads((out / "ddp.json").read_text()))


def launch(spec: TrialSpec, world_size: int, spec_path: Path, out: Path,
           writer: HeartbeatWriter) -> int:
    """Run torchrun to its end, relaying rank events; nothing it started survives."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(world_size), "-m", "nsadiag.checks.ddp_worker",
           str(spec_path), str(out), f"{pg_timeout_s(spec):g}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # no event of ours until the ranks send theirs: until the first forward event the
    # runner allows for a slow start (torchrun, then N imports of torch)
    tails = {rank: EventTail(out / f"rank{rank}.jsonl") for rank in range(world_size)}
    with open(out / "torchrun.txt", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    descendants: dict[int, psutil.Process] = {}
    try:
        while proc.poll() is None:
            _remember(proc.pid, descendants)
            relay(tails, writer)
            time.sleep(POLL_S)
        relay(tails, writer)
        return proc.returncode
    finally:
        _remember(proc.pid, descendants)
        proc.kill()
        proc.wait()
        for child in descendants.values():
            try:
                child.kill()
            except psutil.Error:
                pass


def _remember(pid: int, known: dict[int, psutil.Process]) -> None:
    try:
        for child in psutil.Process(pid).children(recursive=True):
            known.setdefault(child.pid, child)
    except psutil.Error:
        pass


def relay(tails: dict[int, EventTail], writer: HeartbeatWriter) -> None:
    for rank, tail in tails.items():
        for event in tail.read_new():
            if event.get("kind") == "module":
                writer.module(f"rank{rank}.{event['module']}", event["phase"], event["edge"])


def judge(found: dict) -> CheckResult:
    rows, world = found["rows"], found["world_size"]
    bad = [r for r in rows if not r["ok"]]
    worst = max(rows, key=lambda r: r["max abs err"] / r["tol"]) if rows else None
    if not bad:
        summary = (f"{world}-rank DDP gradients match one process on the same global batch "
                   f"within {TOLERANCE:g} relative over {len(rows)} parameter groups "
                   f"(worst {worst['module']}: {worst['max abs err']:.3g})" if worst else
                   f"{world}-rank DDP: the target has no parameters")
        return finding("ddp", True, None, summary, rows, world_size=world)
    first = bad[0]
    summary = (f"{world}-rank DDP gradients differ from one process at {first['module']} "
               f"({first['detail']}: max abs err {first['max abs err']:.3g} > tol "
               f"{first['tol']:.3g}); {len(bad)} of {len(rows)} parameter groups differ")
    return finding("ddp", False, first["module"], summary, rows, world_size=world)
