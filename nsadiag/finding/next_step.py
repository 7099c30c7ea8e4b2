"""The next step of a stuck run, from the end of its wait chain (nsadiag.verdict.chain),
and of a slow run, from its cause class (nsadiag.verdict.slow_cause): never from the
verdict's name alone.

``chain_next(chain)`` says what to change for each way a chain ends: the advice of the
family of waits that owns the end (nsadiag.verdict.waits), a lock sentence only where a
lock is in the chain, end of file for a child reading a pipe this process holds, a timeout
for a polling loop, and so on. None for a chain whose end the evidence does not name: the
caller then says what it knows without a cause.
"""

from __future__ import annotations

from collections.abc import Sequence

from nsadiag.verdict.waits import advice
from nsadiag.verdict.waits.model import WaitChain
from nsadiag.verdictfacts import Load, SlowCause, Worker


def chain_next(chain: WaitChain) -> str | None:
    """One sentence: what to change where the chain ends, from the family of waits that
    owns its end (nsadiag.verdict.waits); None where the end names no cause."""
    return advice(chain)


def _workers_said(workers: Sequence[Worker]) -> tuple[str, str]:
    """("2 DataLoader workers", "read_record (data.py:26) `time.sleep(...)`") of the workers
    sampled at the kill, their line said once when they share it."""
    places = sorted({str(worker.where) for worker in workers if worker.where})
    code = next((f" `{w.code}`" for w in workers if w.code), "") \
        if len(places) == 1 else ""
    noun = "DataLoader worker" + ("s" if len(workers) > 1 else "")
    return f"{len(workers)} {noun}", " and ".join(places) + code


def _data_next(cause: SlowCause, load: Load | None) -> str:
    share = f"{cause.share:.0%}"
    workers = cause.workers or ()
    if not workers and cause.loaded_at:
        # workers overlap the loading with training, but divide its cost by at most the
        # CPUs there are: work the dataset repeats for every item is fixed only where it is
        return (f"Make the dataset's own code cheaper, then load the batches in worker "
                f"processes: the main process was in the DataLoader's `__next__` in {share} "
                f"of its samples, running the dataset's code itself, most at "
                f"{cause.loaded_at}. Look there first for work done again for every item "
                f"that is the same for all of them (a statistic of the whole dataset, a "
                f"vocabulary, a file or a model loaded again): do it once, in `__init__`. "
                f"Then set `num_workers` above 0 (and `prefetch_factor`) so loading "
                f"overlaps training. A faster model will not help.")
    if not workers:
        return (f"Make the input pipeline faster: the main process waited for batches in "
                f"{share} of its samples, and no DataLoader worker was sampled to say "
                f"which part is slow; time the dataset alone (its `__getitem__` and the "
                f"storage it reads), then add workers, faster storage or prefetch as that "
                f"shows. A faster model will not help.")
    many, where = _workers_said(workers)
    idle = sum(w.samples - w.active for w in workers)
    total = sum(w.samples for w in workers)
    inside = sum(w.in_own for w in workers)
    if 2 * inside < total:
        return (f"Find what delays the batches between the workers and the main process: "
                f"the main process waited for batches in {share} of its samples while its "
                f"{many} {'were' if len(workers) > 1 else 'was'} outside the dataset's code "
                f"(waiting for work) in {total - inside} of {total} samples; look at the "
                f"collate function, `pin_memory` and the batch's size. A faster model will "
                f"not help.")
    if 2 * idle >= total:
        return (f"Make the batches arrive faster: the main process waited for them in "
                f"{share} of its samples while its {many} sat at {where}, off the CPU in "
                f"{idle} of {total} samples (a wait such as a read, not computation): read "
                f"from faster or local storage (or cache what is read), and raise "
                f"`num_workers` above {len(workers)} and `prefetch_factor` so more reads "
                f"overlap. A faster model will not help.")
    busy = load.load_per_cpu if load is not None else None
    more = (f"the machine's CPUs were already busy (load {busy:.1f} per CPU), so more "
            f"workers will not help" if busy is not None and busy >= 1 else
            f"raise `num_workers` above {len(workers)} while CPUs are free")
    return (f"Make each batch cheaper to build: the main process waited for batches in "
            f"{share} of its samples while its {many} computed at {where} (on the CPU in "
            f"{total - idle} of {total} samples); precompute that work once, or {more}. A "
            f"faster model will not help.")


def _recompile_next(cause: SlowCause) -> str:
    guard, function = cause.guard, cause.function
    counted = (f"the guard `{guard}` failed, and Dynamo compiled `{function}` again "
               f"{cause.recompiles} times in {cause.steps} steps")
    if cause.size_dim is not None:
        dim = cause.size_dim
        return (f"Stop the recompiles: {counted}, once for each new size of dimension {dim}; "
                f"compile with `dynamic=True` (or mark dimension {dim} dynamic with "
                f"`torch._dynamo.mark_dynamic`), or pad the inputs to a few fixed sizes.")
    return (f"Stop the recompiles: {counted}; keep what that guard checks the same from "
            f"step to step, or make it an input Dynamo treats as dynamic.")


def _recompute_next(cause: SlowCause) -> str:
    called = f" (checkpointed at {cause.called_at})" if cause.called_at else ""
    hottest = (f"; or, if the recomputed line's result needs no gradient, compute it "
               f"outside the checkpointed function (its hottest line: {cause.inner})"
               if cause.inner else "")
    return (f"Checkpoint less: the backward spent {cause.backward_share:.0%} of its "
            f"samples rerunning checkpointed forwards{called}; checkpoint fewer blocks, or "
            f"save the costly results with a selective checkpoint policy "
            f"(`torch.utils.checkpoint.create_selective_checkpoint_contexts`){hottest}.")


def slow_next(cause: SlowCause, load: Load | None = None) -> str:
    """One sentence: what to change for a SLOW run's cause class (nsadiag.verdict
    .slow_cause), from the figures that classified it; ``load`` the machine's load facts
    (whether more worker processes could run)."""
    if cause.kind == "data-bound":
        return _data_next(cause, load)
    if cause.kind == "recompiles":
        return _recompile_next(cause)
    if cause.kind == "outside-model":
        return (f"Make {cause.loaded_at} cheaper: it does tensor work of its own outside the "
                f"model ({cause.share or 0:.0%} of the training samples); print the shapes "
                f"of the tensors it takes and makes (`t.shape`): an unintended broadcast "
                f"(`[B, 1] - [B]` is `[B, B]`) or work redone every step shows there.")
    if cause.kind == "model-compute":
        busy = _busy(load)
        return (f"Nothing to fix: no defect was found, the time goes into the model's own "
                f"work. To finish sooner give the run more time, make the model or the batch "
                f"smaller, or run it on a faster device (a GPU){busy}.")
    return _recompute_next(cause)


def _busy(load: Load | None) -> str:
    """", and on a machine less busy: ..." when the load figures say contention slowed it."""
    if load is None or not load.contended:
        return ""
    got = f"; the main thread got {load.got:.0%} of the CPU it asked for" \
        if load.got is not None else ""
    return (f"; the machine was busy (load {load.load_per_cpu:.1f} per CPU{got}), so a "
            f"quieter one runs it faster too")
