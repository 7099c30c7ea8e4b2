"""The per-rank collective counter of a DDP trial (the rank side).

Every collective a rank issues gets a number n = 1, 2, 3, ... (per rank, over all process
groups) and two heartbeat events of kind "collective", written through the rank's
heartbeat file (see nsadiag.harness.heartbeat for the common fields):

    edge     "start" when it is issued, "end" when its work completed
    n        the rank's collective number (1-based: "all_reduce #7" is its 7th collective)
    op       "all_reduce", "broadcast", "barrier", ...
    origin   "ddp" for a gradient bucket of DistributedDataParallel (through its comm
             hook), "call" for a torch.distributed call of the trial or the model
    detail   e.g. "DDP bucket 0, 3 tensors" or "2 tensors, group of 2 ranks, from train
             (train.py:41)" (a call names the innermost frame outside torch that issued it)
    shapes   shapes of the tensors involved (the flat bucket for DDP)
    bytes    on "start" only: the bytes of those tensors (what the transport moves; two
             ranks whose collectives #n differ in size have left the common path)
    status   on "end" only: "ok", or "error" when the work failed (e.g. a timeout)
    rank     this rank

Two sources feed it: `ddp_hook` is DDP's default allreduce comm hook, counted (the same
arithmetic, so gradients are unchanged; `counted_hook` wraps a comm hook of the user's own
and counts each of its buckets as one collective of op "comm_hook"), and
`CollectiveCounter.install` replaces the collective functions in the `torch.distributed`
namespace by counting wrappers, so a
`dist.all_reduce(...)` issued anywhere at call time is counted. DDP's own hook calls
`dist.all_reduce` too; a thread-local flag keeps that call from being counted twice.
DDP's internal bookkeeping collectives (the parameter broadcast at construction) go
through private functions and are not counted on any rank, so counts stay comparable.

`summarize(events)` reads the collective events back (pure; the parent uses it).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from nsadiag.harness.heartbeat import HeartbeatWriter
from nsadiag.probes import counters
from nsadiag.probes.counters import outside_compiled_code

WRAPPED = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all_single",
           "barrier", "all_gather_object", "broadcast_object_list")
"""torch.distributed functions counted when called through the torch.distributed name."""
WRAPPER_FILES = (__file__, counters.__file__)


def _tensors(values: Iterable[Any]) -> list[Any]:
    import torch

    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += [v for v in value if isinstance(v, torch.Tensor)]
    return found


def _shapes(values: Iterable[Any]) -> list[list[int]]:
    return [list(tensor.shape) for tensor in _tensors(values)]


def _bytes(values: Iterable[Any]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in _tensors(values))


class CollectiveCounter:
    """Numbers the collectives of one rank and writes their start and end events."""

    def __init__(self, writer: HeartbeatWriter):
        self.writer = writer
        self.count = 0
        self._lock = threading.Lock()
        self._inside = threading.local()
        self._originals: dict[str, Callable[..., Any]] = {}

    def start(self, op: str, origin: str, detail: str, shapes: list[list[int]],
              nbytes: int | None = None) -> int:
        with self._lock:
            self.count += 1
            n = self.count
        self.writer.collective("start", n, op, origin, detail, shapes, nbytes=nbytes)
        return n

    def end(self, n: int, op: str, origin: str, detail: str, ok: bool) -> None:
        self.writer.collective("end", n, op, origin, detail, [], "ok" if ok else "error")

    def end_when_done(self, future: Any, n: int, op: str, origin: str, detail: str) -> None:
        """Write the end event when `future` (a torch.futures.Future) completes."""
        def done(fut: Any) -> None:
            try:
                fut.value()
                ok = True
            except Exception:  # the work failed (timeout, peer gone): recorded, not raised
                ok = False
            self.end(n, op, origin, detail, ok)

        future.add_done_callback(done)

    # ---- DDP comm hook --------------------------------------------------------------------

    def ddp_hook(self, state, bucket):
        """DDP's default allreduce hook, counted: register with
        `ddp.register_comm_hook(process_group_or_None, counter.ddp_hook)`. Left without
        annotations: DDP checks them and accepts only dist.GradBucket / Future."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        detail = f"DDP bucket {bucket.index()}, {len(bucket.gradients())} tensors"
        return self._counted_bucket("all_reduce", detail, allreduce_hook, state, bucket)

    def _counted_bucket(self, op: str, detail: str, hook: Callable[..., Any], state: Any,
                        bucket: Any) -> Any:
        """Run one bucket's comm hook as one counted collective; the collectives the hook
        itself issues are not counted again."""
        buffer = bucket.buffer()
        n = self.start(op, "ddp", detail, [list(buffer.shape)],
                       buffer.numel() * buffer.element_size())
        self._inside.active = True
        try:
            future = hook(state, bucket)
        finally:
            self._inside.active = False
        self.end_when_done(future, n, op, "ddp", detail)
        return future

    def counted_hook(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        """A user's DDP comm hook, counted: each bucket is one collective (op "comm_hook");
        the collectives the hook itself issues are not counted again."""
        name = getattr(hook, "__qualname__", type(hook).__name__)

        def counted(state, bucket):
            detail = (f"DDP bucket {bucket.index()}, {len(bucket.gradients())} tensors, "
                      f"comm hook {name}")
            return self._counted_bucket("comm_hook", detail, hook, state, bucket)

        counted.__qualname__ = name
        return counted

    # ---- torch.distributed wrappers -------------------------------------------------------

    def install(self) -> None:
        """Replace the WRAPPED functions in the torch.distributed namespace."""
        import torch.distributed as dist

        for name in WRAPPED:
            original = getattr(dist, name, None)
            if original is None or name in self._originals:
                continue
            self._originals[name] = original
            setattr(dist, name, self._wrap(name, original))

    def remove(self) -> None:
        import torch.distributed as dist

        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()

    def _wrap(self, op: str, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original``, counted when run eagerly; a compiled function that calls it gets
        ``original`` itself (Dynamo turns it into a functional collective)."""
        def counted(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._inside, "active", False):
                return original(*args, **kwargs)
            detail = _call_detail(args, kwargs)
            values = [*args, *kwargs.values()]
            n = self.start(op, "call", detail, _shapes(values), _bytes(values))
            try:
                work = original(*args, **kwargs)
            except Exception:
                self.end(n, op, "call", detail, ok=False)
                raise
            if kwargs.get("async_op") and work is not None:
                self.end_when_done(work.get_future(), n, op, "call", detail)
            else:
                self.end(n, op, "call", detail, ok=True)
            return work

        return functools.wraps(original)(outside_compiled_code(counted, original))


def _call_detail(args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    import torch

    group = kwargs.get("group")
    tensors = sum(1 for v in [*args, *kwargs.values()] if isinstance(v, torch.Tensor))
    where = "default group" if group is None else f"group of {group.size()} ranks"
    detail = f"{tensors} tensor{'s' if tensors != 1 else ''}, {where}"
    caller = _caller()
    return f"{detail}, from {caller}" if caller else detail


def _caller() -> str | None:
    """"function (file:line)" of the innermost frame outside torch and nsadiag's wrappers
    (this module, nsadiag.probes.counters): the code that issued the collective."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if f"{os.sep}torch{os.sep}" not in path and path not in WRAPPER_FILES:
            return f"{frame.f_code.co_name} ({os.path.basename(path)}:{frame.f_lineno})"
        frame = frame.f_back
    return None


# ---- reading the events back (pure) ---------------------------------------------------


def summarize(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a rank's collective events say: issued (the highest number started),
    completed (the highest number ended ok), open (started, no end, oldest first: each as
    {n, op, origin, detail, shapes, t, phase, step}), failed (ended with an error), and
    the last started one."""
    started: dict[int, dict[str, Any]] = {}
    ended: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.get("kind") != "collective":
            continue
        (started if event.get("edge") == "start" else ended)[int(event["n"])] = event
    keep = ("n", "op", "origin", "detail", "shapes", "t", "phase", "step", "bytes")
    open_ = [{k: started[n].get(k) for k in keep} for n in sorted(started) if n not in ended]
    failed = [{k: started.get(n, ended[n]).get(k) for k in keep} for n in sorted(ended)
              if ended[n].get("status") == "error"]
    ok = [n for n, e in ended.items() if e.get("status") != "error"]
    last = started[max(started)] if started else None
    return {"issued": max(started) if started else 0, "completed": max(ok) if ok else 0,
            "open": open_, "failed": failed,
            "last": {k: last.get(k) for k in keep} if last else None}
