"""What to do about an error whose cause nsadiag knows (nsadiag.verdict.known names the
error and its cause; the advice lives here, with the other next steps)."""

from __future__ import annotations

from nsadiag.verdict.known import (
    COLLECTIVE_TIMEOUT,
    DEVICE_ASSERT,
    FILES_ERROR,
    KNOWN_ERRORS,
    PORT_ERROR,
    READY_TWICE_ERROR,
    SHM_ERROR,
)

KNOWN_FIXES: dict[str, tuple[str, ...]] = {
    READY_TWICE_ERROR: (
        "bind the block when the checkpoint is made: checkpoint(blk, x), "
        "functools.partial(checkpoint, blk) or `lambda x, blk=blk: blk(x)`",
        "use non-reentrant checkpointing (use_reentrant=False), then verify the "
        "gradients with `nsadiag check ckpt`: a late-bound closure stays silently wrong "
        "there",
        "DDP's static_graph=True only hides the double gradient"),
    SHM_ERROR: (
        "give /dev/shm room for the workers' batches: in Docker `--shm-size=8g` (or "
        "`--ipc=host`), in Kubernetes an `emptyDir` with `medium: Memory` mounted at "
        "/dev/shm; or use fewer DataLoader workers (`num_workers`) or smaller batches",
        "`torch.multiprocessing.set_sharing_strategy('file_system')` keeps the batches out "
        "of /dev/shm"),
    PORT_ERROR: (
        "give the job a free port (`MASTER_PORT`, torchrun's `--master-port` or "
        "`--rdzv-endpoint HOST:PORT`), or end the process that holds it (`ss -ltnp` names "
        "it)",),
    FILES_ERROR: (
        "raise the limit of open files (`ulimit -n 65536` before the run), and close what "
        "is opened per sample",
        "with many DataLoader workers sharing tensors, "
        "`torch.multiprocessing.set_sharing_strategy('file_system')` uses fewer descriptors"),
    COLLECTIVE_TIMEOUT: (
        "find the rank that never reached the collective: run the job under `nsadiag run -- "
        "torchrun ...`, which names it and its line at the stall; a longer process-group "
        "timeout only delays the failure",),
    DEVICE_ASSERT: (
        "rerun with `CUDA_LAUNCH_BLOCKING=1` so the error is raised at the operation that "
        "failed, and check the indices it takes (labels against the number of classes, "
        "embedding indices against the table size)",),
}
assert set(KNOWN_FIXES) == {READY_TWICE_ERROR, *(name for name, _, _ in KNOWN_ERRORS)}, \
    "every known error has its fix"


def fixes_for(known_error: str | None) -> list[str]:
    """The fixes of a known error, the first the one to try first; none for another."""
    return list(KNOWN_FIXES.get(known_error or "", ()))
