"""The other processes of a job: what each live process of its tree that writes no
heartbeat is.

A process forked by multiprocessing (a DataLoader worker, a pool worker) never runs the
injected sitecustomize, and a launcher or helper may run no watched code at all: none of
them writes a heartbeat, yet the one that holds the others up may be among them. At a
stall every live Python process of the job's tree (nsadiag.harness.launch.Launched
.members) that nsadiag does not watch is sampled (nsadiag.harness.capture.capture_all) and
named here by what its stacks and its place in the tree say:

- "DataLoader worker N of rank R" (or "of the main process" outside torchrun): a thread
  runs torch's worker loop (``_worker_loop`` in torch/utils/data/_utils/worker.py); N is
  the loop's ``worker_id`` when its locals were read, else the worker's place among its
  parent's workers by start time (DataLoader starts them in order); R is the RANK of its
  environment (a rank's workers inherit it);
- "the torchrun launcher": torch.distributed.run or torchrun itself;
- "a helper process (...)" otherwise, with the start of its command line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil

from nsadiag.evidence import StackSample
from nsadiag.probes.frames import pool_worker_thread

WORKER_LOOP = ("_worker_loop", "torch/utils/data/_utils/worker.py")


def python_processes(members: Iterable[psutil.Process], watched: set[int]
                     ) -> list[psutil.Process]:
    """The live Python processes among ``members`` whose pid is not in ``watched``."""
    found = []
    for process in members:
        try:
            if process.pid in watched or process.status() == psutil.STATUS_ZOMBIE:
                continue
            command = process.cmdline()
        except psutil.Error:
            continue
        if command and "python" in Path(command[0]).name:
            found.append(process)
    return found


def worker_id(sample: StackSample) -> int | None | bool:
    """The DataLoader worker id of a sampled process: its worker loop's ``worker_id``;
    True when it runs the worker loop but the id was not read; False when it runs no
    worker loop."""
    for thread in sample.threads:
        for frame in thread.frames:
            if frame.function.rsplit(".", 1)[-1] == WORKER_LOOP[0] and \
                    frame.file.endswith(WORKER_LOOP[1]):
                value = (frame.locals or {}).get("worker_id")
                return int(value) if value is not None and value.isdigit() else True
    return False


def _rank(process: psutil.Process) -> str | None:
    try:
        rank = process.environ().get("RANK")
    except psutil.Error:
        return None
    return rank if rank and rank.isdigit() else None


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def roles(processes: Sequence[psutil.Process], samples: dict[int, StackSample | None]
          ) -> dict[int, str]:
    """{pid: what the process is} (see the module docstring); ``samples`` holds the last
    stack sample of each (None when none could be taken)."""
    found: dict[int, str] = {}
    workers: dict[int, list[tuple[float, int]]] = {}  # parent -> [(start time, pid)]
    ids: dict[int, int | bool] = {}
    for process in processes:
        sample = samples.get(process.pid)
        loop = worker_id(sample) if sample is not None else False
        if loop is not False:
            ids[process.pid] = loop
            try:
                workers.setdefault(process.ppid(), []).append((process.create_time(),
                                                               process.pid))
            except psutil.Error:
                workers.setdefault(-1, []).append((0.0, process.pid))
    order = {pid: index for siblings in workers.values()
             for index, (_, pid) in enumerate(sorted(siblings))}
    for process in processes:
        command = _command(process)
        if process.pid in ids:
            number = ids[process.pid]
            number = number if number is not True else order[process.pid]
            rank = _rank(process)
            owner = f"rank {rank}" if rank is not None else "the main process"
            found[process.pid] = f"DataLoader worker {number} of {owner}"
        elif "torch.distributed.run" in command or "torchrun" in command:
            found[process.pid] = "the torchrun launcher"
        elif (sample := samples.get(process.pid)) is not None and \
                pool_worker_thread(sample) is not None:
            found[process.pid] = "a multiprocessing pool worker"
        else:
            shown = command if len(command) <= 60 else command[:57] + "..."
            # a process that ended before its command line was read has none to show
            found[process.pid] = f"a helper process ({shown})" if shown else \
                "a helper process"
    return found
