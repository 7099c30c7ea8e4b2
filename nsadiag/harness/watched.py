"""The heartbeat inside a user's own process: what `nsadiag run` injects into every Python
process its command starts, with no edit to the user's code.

``start(run_dir)`` (called by the injected ``sitecustomize``) gives the process, in
``<run_dir>/proc-<pid>/``:

- ``events.jsonl``: a heartbeat (nsadiag.harness.heartbeat) with a "start" event naming
  the process (pid, rank under torchrun, argv), sampler pulses, and once torch is in use:
  a "forward" start at each top-level module call in training mode, module events of that
  model's blocks (forward pre- and post-hooks only: backward hooks would change the
  autograd graph of a model we do not own), a "backward" start at every
  ``torch.autograd.backward``, a "step" event at every ``Optimizer.step``, and an "end"
  event at exit;
- ``profile.json``: the progress sampler's profile (nsadiag.probes.sampler);
- ``faulthandler.txt``: every thread's stack on SIGUSR1 and on a fatal signal.

torch is not imported here: a thread waits until the user's code has imported
``torch.nn`` and ``torch.optim``, then installs the hooks, so processes that never use
torch (the launcher, a data worker, pip) pay nothing but the sampler.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from nsadiag.harness.heartbeat import HeartbeatWriter
from nsadiag.probes.counters import WorkCounters
from nsadiag.probes.sampler import Sampler

TORCH_POLL_S = 0.2


class Watched:
    """One process's heartbeat, sampler and torch hooks (see the module docstring)."""

    def __init__(self, directory: Path):
        rank = os.environ.get("RANK")
        self.writer = HeartbeatWriter(directory / "events.jsonl",
                                      int(rank) if rank and rank.isdigit() else None)
        self.writer.start("build", pid=os.getpid(), rank=self.writer.rank, job="run",
                          argv=list(sys.argv))
        self.counters = WorkCounters(on_backward=self._on_backward)
        self.sampler = Sampler(self.writer.pulse, directory / "profile.json",
                               counters=self.counters, context=self.writer.context,
                               events=lambda: self.writer.events)
        self.roots: set[int] = set()
        self.depth = threading.local()
        self.steps = 0
        self.marks = {"step": time.perf_counter(), "forward": None, "backward": None}
        self.handles: list[Any] = []
        self.pid = os.getpid()  # a forked child (a data worker) must not write here

    def start(self) -> None:
        self.sampler.start()
        threading.Thread(target=self._install_when_torch_is_used, name="nsadiag-torch-hooks",
                         daemon=True).start()
        atexit.register(self.stop)

    def stop(self) -> None:
        if os.getpid() != self.pid:
            return
        self.sampler.stop()
        self.writer.end("exit")
        self.writer.close()

    def _install_when_torch_is_used(self) -> None:
        while not {"torch.nn", "torch.optim"} <= sys.modules.keys():
            time.sleep(TORCH_POLL_S)
        from torch.nn.modules import module as module_mod
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.counters.install()
        self.handles += [module_mod.register_module_forward_pre_hook(self._enter),
                         module_mod.register_module_forward_hook(self._exit),
                         register_optimizer_step_post_hook(self._on_step)]

    # ---- hooks (run on the training threads) ---------------------------------------------

    def _enter(self, module: Any, args: Any) -> None:
        depth = getattr(self.depth, "n", 0)
        self.depth.n = depth + 1
        if depth or not module.training or os.getpid() != self.pid:
            return
        if id(module) not in self.roots:
            self.roots.add(id(module))
            self._hook_blocks(module)
        if self.marks["forward"] is None:
            self.marks["forward"] = time.perf_counter()
        self.writer.start("forward", self.steps)

    def _exit(self, module: Any, args: Any, output: Any) -> None:
        self.depth.n = max(0, getattr(self.depth, "n", 1) - 1)

    def _hook_blocks(self, root: Any) -> None:
        """Module events for the repeated blocks of a model seen for the first time."""
        from nsadiag.targets import find_blocks

        for name, block in find_blocks(root):
            self.handles += hook_forward(name, block, self.writer)
        self.writer.watched_blocks = len(find_blocks(root))

    def _on_backward(self) -> None:
        if os.getpid() != self.pid:
            return
        if self.marks["backward"] is None:
            self.marks["backward"] = time.perf_counter()
        self.writer.start("backward", self.steps)

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """One optimizer step: the step's time since the last, split at the step's first
        forward and first backward (data loading counts as forward)."""
        if os.getpid() != self.pid:
            return
        now = time.perf_counter()
        began = self.marks["step"]
        backward = self.marks["backward"] or now
        self.writer.step_done(step_s=now - began, forward_s=backward - began,
                              backward_s=now - backward)
        self.marks = {"step": now, "forward": None, "backward": None}
        self.steps += 1


def hook_forward(name: str, block: Any, writer: HeartbeatWriter) -> list[Any]:
    """Forward enter and exit module events of one block (no backward hooks)."""
    return [block.register_forward_pre_hook(lambda m, a: writer.module(name, "forward",
                                                                        "enter")),
            block.register_forward_hook(lambda m, a, o: writer.module(name, "forward",
                                                                       "exit"))]


def start(run_dir: Path) -> Watched | None:
    """Watch this process into ``run_dir/proc-<pid>/``; None when that cannot be written
    (the user's command runs on, unwatched)."""
    directory = run_dir / f"proc-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        from nsadiag.harness.child import arm_faulthandler

        arm_faulthandler(directory / "faulthandler.txt")
        watched = Watched(directory)
    except OSError:
        return None
    watched.start()
    return watched
