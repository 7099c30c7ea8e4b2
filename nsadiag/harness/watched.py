"""The heartbeat inside a user's own process: what `nsadiag run` injects into every Python
process its command starts, and what `nsadiag.watch()` starts in the process that calls
it, with no edit to the user's code.

``start(run_dir)`` (called by the injected ``sitecustomize``) gives the process, in
``<run_dir>/proc-<pid>/``:

- ``events.jsonl``: a heartbeat (nsadiag.harness.heartbeat) with a "start" event naming
  the process (pid, rank under torchrun, argv), sampler pulses, and once torch is in use:
  a "forward" start at each call of the model in training mode, module events of that
  model's blocks (forward pre-hooks only: backward hooks would change the autograd graph
  of a model we do not own; enters only, counted in memory and written by the sampler at
  its interval and at every phase edge, nsadiag.harness.heartbeat.write_blocks),
  a "backward" start at every
  ``torch.autograd.backward``, a "step" event at every ``Optimizer.step``, "collective"
  events (nsadiag.harness.collectives: every torch.distributed collective called through
  the ``torch.distributed`` namespace, and DDP's gradient buckets through a counted comm
  hook), and an "end" event at exit;
- ``profile.json``: the progress sampler's profile (nsadiag.probes.sampler);
- ``faulthandler.txt``: every thread's stack on SIGUSR1 and on a fatal signal;
- ``result.json``: only when an exception ends the process ({"status": "error",
  "exception": {type, message, traceback}, "oom"}), from ``sys.excepthook``;
- ``thread-exceptions.jsonl``: every exception that ended another thread
  (nsadiag.harness.thread_exceptions, through ``threading.excepthook``);
- ``child-exits.jsonl``: how each multiprocessing child it reaped ended
  (nsadiag.harness.child_exits);
- ``fork-<pid>.json``: one per child it forked, written by the child, with the containers
  of Python objects a DataLoader's dataset held at the fork (nsadiag.probes.forks).

The rank is torchrun's RANK, unless the parent process has the same RANK: then this is a
helper of that rank (a spawned DataLoader worker), watched but not a rank.

DDP's buckets: at the first forward of each DistributedDataParallel module that has no comm
hook, the counted default allreduce hook is registered (the same arithmetic as DDP's
built-in one); a comm hook the user registers, before or after, is wrapped to be counted.
A user hook registered after the first forward would be refused by DDP (one hook per
module): this is the one behaviour the injection can change, and registering after the
first forward is not how DDP is used.

What it costs: nothing per module call. A global module hook would send every module
call of the process through torch's slow path with hooks (16 % of a step of a model of 64
small blocks for an empty pre- and post-hook pair; docs/observer.md), so the global forward
pre-hook lives only until the model is found: the first module call in training mode of a
module with parameters is the model's (its outermost call comes before its children's).
Then hooks go on that model and its repeated blocks (nsadiag.targets find_blocks),
registered before the call goes on, so a model compiled later compiles with them in place
and the guards never see them change; the global hook is removed. One model per process is
watched so, the first one trained (another model trained later shows through its steps, its
backward and the sampler). A block call costs torch's hook path and a counted enter (the
work counter ``calls`` counts block calls here, ``block`` names the last; nothing is written
or timed per block call), the model's call a "forward" start and two memory marks. Where
the block hooks cost more than a small share of the training thread's CPU time per step (a
model of many tiny blocks), only one block in so many keeps its hook after the first few
steps, and the block named says so (nsadiag.harness.thinning): the always-on cost is a
bounded share of the step, whatever the number of blocks and modules.

Compiled code is left as it is: inside a region torch.compile traces, every hook does
nothing and reads nothing (nsadiag.probes.counters.outside_compiled_code), so a compiled
model compiles as often as without nsadiag; its blocks' events and an optimizer step
compiled with the model are not seen, the call of the compiled model, its backward and
an eager optimizer step are.

torch is not imported here: the sampler's thread, after each sample, looks whether the
user's code has imported ``torch.nn`` and ``torch.optim``, then installs the hooks, so
processes that never use torch (a launcher script, a data worker, pip) pay nothing but the
sampler; it also reads what Dynamo compiled. The sampler is the one thread nsadiag adds to
the process: each wake-up of a thread of ours takes the GIL from the program's main thread
(docs/observer.md).
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nsadiag.harness import child_exits, thread_exceptions
from nsadiag.harness.heartbeat import HeartbeatWriter
from nsadiag.harness.thinning import StrideDecision, WatchedBlock, watched_blocks
from nsadiag.harness.uncopied import keep_out_of_copies
from nsadiag.probes import forks
from nsadiag.probes.counters import WorkCounters, outside_compiled_code, skip_dynamo_frames
from nsadiag.probes.recompiles import COMPILE_POLL_S, CompileWatch
from nsadiag.probes.sampler import Sampler
from nsadiag.ranknames import rank_names

TORCH_MODULES = ("torch", "torch.nn", "torch.optim", "torch.distributed")


@dataclass(frozen=True)
class ObserverParts:
    """Which parts of the observer a watched process runs; all of them under ``nsadiag
    run``. bench/bench_gil_handoffs.py turns them off one at a time, to tell what each
    costs the program's main thread."""

    sampler: bool = True
    """The sampler thread (nsadiag.probes.sampler): stacks, loop counters, pulses; the
    parts below run on its wake-ups, and without it not at all."""
    block_events: bool = True
    """The sampler writes the blocks' "module" events (HeartbeatWriter.write_blocks)."""
    torch_hooks: bool = True
    """The torch hooks, installed once torch is used (from the sampler's thread)."""
    compile_watch: bool = True
    """The polling of Dynamo's compile records (nsadiag.probes.recompiles)."""
    block_hooks: bool = True
    """The forward pre-hooks on the model's blocks (the other torch hooks stay)."""


def own_rank(environ: dict[str, str] | None = None, parent_rank: str | None = None
             ) -> int | None:
    """This process's torchrun rank: RANK, unless the parent has the same RANK (then this
    process is a helper of that rank); None outside torchrun."""
    env = os.environ if environ is None else environ
    rank = env.get("RANK")
    if not rank or not rank.isdigit():
        return None
    if parent_rank is None:
        parent_rank = _environ_of(os.getppid()).get("RANK")
    return None if parent_rank == rank else int(rank)


def _environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _imported(names: tuple[str, ...]) -> bool:
    """Every module in `names` is in sys.modules and has finished executing."""
    for name in names:
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if module is None or getattr(spec, "_initializing", False):
            return False
    return True


class ProcessHeartbeat:
    """One process's heartbeat, sampler and torch hooks (see the module docstring)."""

    def __init__(self, directory: Path, job: str = "run",
                 parts: ObserverParts = ObserverParts()):
        self.directory = directory
        self.parts = parts
        self.writer = HeartbeatWriter(directory / "events.jsonl", own_rank(), buffered=True)
        self.writer.start("build", pid=os.getpid(), rank=self.writer.rank, job=job,
                          argv=list(sys.argv), orig_argv=list(sys.orig_argv),
                          names=rank_names(os.environ).to_dict())
        self.counters = WorkCounters(on_backward=self._on_backward)
        self.sampler = Sampler(self.writer.pulse, directory / "profile.json",
                               counters=self.counters, context=self.writer.context,
                               events=lambda: self.writer.events,
                               step=lambda: self.writer.step,
                               on_sample=self._tick)
        self.root: Any = None  # the model, once its first training call was seen
        self.finder: Any = None  # the global pre-hook's handle until then
        self.blocks: list[tuple[str, Any]] = []  # the model's repeated blocks, by name
        self.block_handles: dict[int, Any] = {}  # the hooks on them, by the block's index
        self.thinning: StrideDecision | None = None  # until the stride is decided
        self.block_stride = 1  # one block in this many keeps its hook
        self.steps = 0
        self.marks = {"step": time.perf_counter(), "forward": None, "backward": None}
        self.handles: list[Any] = []
        self.collectives: Any = None
        self.restore: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)
        self.pid = os.getpid()
        self.forked = False  # a forked child (a data worker) must not write here
        os.register_at_fork(after_in_child=self._after_fork)
        self.stopped = threading.Event()
        self.previous_excepthook = sys.excepthook
        self.uninstall_thread_hook: Any = None
        self.uninstall_child_exits: Any = None
        self.fork_notes: forks.ForkNotes | None = None
        # the torch hooks' stage (_torch_stage): "torch", "dynamo", "compiles", "done"
        self.stage = "torch"
        self.compiles: CompileWatch | None = None
        self.next_compile_poll = 0.0

    def start(self) -> None:
        if self.parts.sampler and self.parts.torch_hooks:
            # a process that has imported torch already (``nsadiag.watch`` around a loop)
            # gets its hooks now, before its first step, not at the sampler's first tick;
            # before the sampler starts, so the two never run a stage at once
            self._torch_stage()
        if self.parts.sampler:
            self.sampler.start()
        sys.excepthook = self._excepthook
        self.uninstall_thread_hook = thread_exceptions.install(
            self.directory / thread_exceptions.FILE_NAME)
        self.uninstall_child_exits = child_exits.install(self.directory / child_exits.FILE_NAME)
        self.fork_notes = forks.install(self.directory)
        atexit.register(self.stop)

    def _after_fork(self) -> None:
        self.forked = True

    def stop(self, remove: bool = False) -> None:
        """Stop the sampler and close the heartbeat with an "end" event; with `remove`,
        also take every hook and wrapper out again (the process goes on unwatched)."""
        if os.getpid() != self.pid or self.stopped.is_set():
            return
        self.stopped.set()
        self.sampler.stop()
        if remove:
            self._remove()
        self.writer.end("exit")
        self.writer.close()

    def _remove(self) -> None:
        if self.finder is not None:
            self.finder.remove()
            self.finder = None
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.block_handles.clear()
        self.thinning = None
        if self.collectives is not None:
            self.collectives.remove()
        for owner, name, original in reversed(self.restore):
            setattr(owner, name, original)
        self.restore.clear()
        self.counters.remove()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self.previous_excepthook
        if self.uninstall_thread_hook is not None:
            self.uninstall_thread_hook()
        if self.uninstall_child_exits is not None:
            self.uninstall_child_exits()
        if self.fork_notes is not None:
            self.fork_notes.active = False

    def _excepthook(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if os.getpid() == self.pid:
            self.record_exception(value)
        self.previous_excepthook(kind, value, tb)

    def record_exception(self, exc: BaseException) -> None:
        """Write result.json for an exception that ends the process (or the watched
        block)."""
        from nsadiag.harness.child import describe, write_result

        found = describe(exc)
        oom = found.pop("oom")
        result = {"status": "error", "oom": oom, "exception": found}
        if oom:  # the allocator as it failed: free in pieces, or full
            from nsadiag.probes.fragmentation import at_oom

            result["fragmentation"] = at_oom(exc)
        try:
            write_result(self.directory / "result.json", result)
        except OSError:
            pass  # the user's exception is what matters; the traceback reaches stderr

    def _tick(self) -> None:
        """What the observer does on the sampler's thread after each of its samples: the
        blocks' event, and the torch hooks' stages. One thread's wake-ups for all of it:
        every wake-up of a thread of ours takes the GIL from the model's thread, which
        then waits for it, and on a loaded machine for a core (a thread of its own that
        polled for torch and then for compiles woke 1 to 5 times a second;
        bench/bench_gil_handoffs.py)."""
        if self.stopped.is_set() or self.forked:
            return
        if self.parts.block_events:
            self.writer.write_blocks(wait=False)  # skipped, not waited for: see heartbeat
        if self.parts.torch_hooks:
            self._torch_stage()

    def _torch_stage(self) -> None:
        """Install the torch hooks once the user's code has imported torch.nn and
        torch.optim, have Dynamo skip their frames once it is loaded, then read what it
        compiled every COMPILE_POLL_S. Each stage is entered once: a failure in one is
        counted by the sampler and not tried again."""
        if self.stage == "torch":
            if not _imported(TORCH_MODULES):
                return
            self.stage = "dynamo"
            self._install_torch_hooks()
        if self.stage == "dynamo":
            if not skip_dynamo_frames():  # see nsadiag.probes.counters.outside_compiled_code
                return
            self.stage = "compiles" if self.parts.compile_watch else "done"
            # what Dynamo compiled, and the guard that failed for each recompile (read only)
            self.compiles = CompileWatch(self.writer.compiled)
        now = time.monotonic()
        if self.stage == "compiles" and now >= self.next_compile_poll:
            self.next_compile_poll = now + COMPILE_POLL_S
            self.compiles.poll()

    def _install_torch_hooks(self) -> None:
        from torch.nn.modules import module as module_mod
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.counters.install(count_calls=False)
        # torch warns that global hooks fire once more for the wrapper torch.compile(model)
        # returns; the hooks are nsadiag's and count that call once, so the user's stderr
        # stays as it is without nsadiag (and a -W error run is not ended by it)
        warnings.filterwarnings("ignore", category=UserWarning,
                                message=r"Using `torch\.compile\(module\)` when there are "
                                        r"global hooks on modules")
        self.finder = module_mod.register_module_forward_pre_hook(
            outside_compiled_code(self._find_model))
        self.handles.append(
            register_optimizer_step_post_hook(outside_compiled_code(self._on_step)))
        self._count_collectives()

    def _count_collectives(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from nsadiag.harness.collectives import CollectiveCounter

        self.collectives = CollectiveCounter(self.writer)
        self.collectives.install()
        self._count_ddp_buckets()

    def _count_ddp_buckets(self) -> None:
        """Patch DistributedDataParallel (see the module docstring)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        counter, pid = self.collectives, self.pid
        forward, register = DDP.forward, DDP.register_comm_hook
        builtin = getattr(DDP, "_register_builtin_comm_hook", None)

        def counted_register(ddp: Any, state: Any, hook: Any) -> Any:
            ddp._nsadiag_hooked = True
            return register(ddp, state, counter.counted_hook(hook))

        def counted_builtin(ddp: Any, comm_hook_type: Any) -> Any:
            ddp._nsadiag_hooked = True  # a C++ hook: its buckets cannot be counted
            return builtin(ddp, comm_hook_type)

        def counted_forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(ddp, "_nsadiag_hooked", False) and os.getpid() == pid:
                ddp._nsadiag_hooked = True
                if not getattr(ddp, "_comm_hooks", None) and \
                        not getattr(ddp, "_use_python_reducer", False):
                    try:
                        register(ddp, None, counter.ddp_hook)
                    except (RuntimeError, ValueError):
                        pass  # DDP refused a hook: the buckets go uncounted, nothing else
            return forward(ddp, *args, **kwargs)

        self.restore += [(DDP, "forward", forward), (DDP, "register_comm_hook", register)]
        DDP.forward, DDP.register_comm_hook = counted_forward, counted_register
        if builtin is not None:
            self.restore.append((DDP, "_register_builtin_comm_hook", builtin))
            DDP._register_builtin_comm_hook = counted_builtin

    # ---- hooks (run on the training threads) ---------------------------------------------

    def _find_model(self, module: Any, args: Any) -> None:
        """The global pre-hook, until the model is found (see the module docstring). It may
        fire before the installing thread kept its handle: the next call finds the model."""
        if self.forked or self.root is not None or self.finder is None or \
                not module.training or next(module.parameters(), None) is None:
            return
        self.root = module
        self.finder.remove()
        self.finder = None
        on_root = [module.register_forward_pre_hook(outside_compiled_code(self._enter)),
                   module.register_forward_hook(outside_compiled_code(self._exit))]
        keep_out_of_copies(module, on_root)  # torch.save(model) works as without nsadiag
        self.handles += on_root
        self.writer.count_blocks(self.counters.entered)
        self.blocks = self._find_blocks(module) if self.parts.block_hooks else []
        for watched in watched_blocks([name for name, _ in self.blocks], 1):
            self._hook_block(watched)
        if len(self.blocks) > 1:
            self.thinning = StrideDecision(len(self.blocks))
        self._enter(module, args)  # this call's pre-hooks were read before ours was added

    def _hook_block(self, watched: WatchedBlock) -> None:
        """A pre-hook only: the block entered last is the one running (blocks are
        siblings), and a second hook per block would double what blocks cost."""
        block = self.blocks[watched.index][1]
        handle = block.register_forward_pre_hook(
            self.counters.block_hook(watched.label, watched.stands_for))
        keep_out_of_copies(block, [handle])  # torch.save(model) works as without nsadiag
        self.block_handles[watched.index] = handle
        self.handles.append(handle)

    def _thin_block_hooks(self, stride: int) -> None:
        """Keep the hooks of one block in ``stride`` (nsadiag.harness.thinning); on the
        training thread, between two steps, so no hook dict changes while torch runs it."""
        for handle in self.block_handles.values():
            handle.remove()
            self.handles.remove(handle)
        self.block_handles.clear()
        for watched in watched_blocks([name for name, _ in self.blocks], stride):
            self._hook_block(watched)
        self.block_stride = stride

    def _enter(self, module: Any, args: Any) -> None:
        if self.forked:
            return
        self.sampler.mark_memory()  # what this call allocates is its caller's line's
        if not module.training:
            return
        if self.marks["forward"] is None:
            self.marks["forward"] = time.perf_counter()
        self.writer.enter_phase("forward", self.steps)

    def _exit(self, module: Any, args: Any, output: Any) -> None:
        if not self.forked:
            self.sampler.mark_memory()

    def _find_blocks(self, root: Any) -> list[tuple[str, Any]]:
        """The repeated blocks of the model, by name."""
        from nsadiag.targets import find_blocks

        root = getattr(root, "_orig_mod", root)  # torch.compile(model) wraps the model
        inner = getattr(root, "module", None)  # DDP and DataParallel wrap the model
        prefix = "module." if inner is not None and len(list(root.children())) == 1 else ""
        blocks = find_blocks(inner if prefix else root)
        self.writer.watched_blocks = len(blocks)
        return [(prefix + name, block) for name, block in blocks]

    def _on_backward(self) -> None:
        if self.forked:
            return
        if self.marks["backward"] is None:
            self.marks["backward"] = time.perf_counter()
        self.writer.enter_phase("backward", self.steps)

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """One optimizer step: the step's time since the last, split at the step's first
        forward and first backward (data loading counts as forward). Events after it are
        the next step's."""
        if self.forked:
            return
        now = time.perf_counter()
        began = self.marks["step"]
        backward = self.marks["backward"] or now
        self.writer.step_done(step_s=now - began, forward_s=backward - began,
                              backward_s=now - backward)
        self.marks = {"step": now, "forward": None, "backward": None}
        self.steps += 1
        if self.thinning is not None:
            stride = self.thinning.step_ended(self.counters.calls, time.thread_time(),
                                              threading.get_ident())
            if stride is not None:
                self.thinning = None
                if stride > 1:
                    self._thin_block_hooks(stride)
        # what happens until the next forward (loading the next batch, a collective the
        # script issues between steps) belongs to the next step's forward
        self.writer.phase, self.writer.step = "forward", self.steps


def process_dir(run_dir: Path, pid: int | None = None) -> Path:
    """Where a watched process writes: ``<run_dir>/proc-<pid>/``."""
    return run_dir / f"proc-{os.getpid() if pid is None else pid}"


def start(run_dir: Path, job: str = "run", parts: ObserverParts = ObserverParts()
          ) -> ProcessHeartbeat | None:
    """Watch this process into ``run_dir/proc-<pid>/`` with the observer's ``parts``; None
    when that cannot be written (the user's command runs on, unwatched)."""
    directory = process_dir(run_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        from nsadiag.harness.child import arm_faulthandler

        arm_faulthandler(directory / "faulthandler.txt")
        watched = ProcessHeartbeat(directory, job, parts)
    except OSError:
        return None
    watched.start()
    return watched


def disarm_faulthandler() -> None:
    """Undo ``arm_faulthandler`` for SIGUSR1 and fatal signals (the process goes on
    unwatched)."""
    faulthandler.unregister(signal.SIGUSR1)
    faulthandler.disable()
