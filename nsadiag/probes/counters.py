"""Work counters of a watched process: module calls and autograd nodes run.

Both only move when the model does work, so a sampler that sees them move knows the
process progresses even while its Python stack stands still: a loop of submodule calls
inside one block moves ``calls``; a backward pass, whose Python stack sits in
``loss.backward()`` from start to end, moves ``nodes``.

calls   a global forward pre-hook on every ``nn.Module``
        (``torch.nn.modules.module.register_module_forward_pre_hook``): one increment per
        module call. Any global module hook sends every module call through torch's slow
        path with hooks: 7 % of a step of a model of 64 small blocks (bench/bench_overhead.py),
        so a watched user process installs with ``count_calls=False`` and counts the calls
        of its model's blocks instead (nsadiag.harness.watched).
nodes   pre-hooks on a spread of the autograd graph's nodes, installed when a backward
        starts (``torch.autograd.backward`` and ``torch.autograd.grad`` are wrapped, which
        ``Tensor.backward`` goes through) and removed when it returns. Walking the graph
        costs about a microsecond per node and a hook about five, so at most MAX_HOOKS
        nodes are hooked, evenly spread in walk order (never a parameter's AccumulateGrad
        node: it outlives the backward, and so would the cost of a hook once on it), and
        a backward is instrumented only while backwards are long enough to matter: the
        first one, and any after one that took LONG_BACKWARD_S or more (every backward is
        timed, so one that grows long is instrumented from the next on). Short backwards
        cost no walk of their graph.
        ``op`` is the name of the last hooked node that ran in the backward now running,
        e.g. "MmBackward0"; None outside backward and in a backward that is not
        instrumented.

Hooks are invisible to torch.compile: inside code Dynamo traces, a hook of nsadiag's does
nothing (``outside_compiled_code``), so no attribute it reads or writes becomes a guard
and no call of it breaks a graph; a compiled model compiles as often as it does without
nsadiag. Inside a compiled region ``calls`` does not move: its progress shows at its
boundaries (each call of the compiled module, each backward, each optimizer step) and in
the sampled stacks.

torch is imported by ``install``, not at module import.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

MAX_HOOKS = 512
LONG_BACKWARD_S = 0.5


class WorkCounters:
    """Module calls and autograd nodes run so far, and the last node's name.

    Plain attributes written by hooks on the training threads and read by the sampler
    thread; an int or str assignment is atomic under the GIL, so no lock is needed.
    """

    def __init__(self, on_backward: Callable[[], None] | None = None) -> None:
        """``on_backward`` is called as each backward starts (e.g. a heartbeat's phase)."""
        self.on_backward = on_backward
        self.calls = 0
        self.nodes = 0
        self.op: str | None = None
        self.block: str | None = None  # the block entered last (``block_hook``)
        self.in_backward = 0  # backward calls now running (nested reentrant ones count)
        self._handles: list[Any] = []
        self._originals: dict[str, Callable[..., Any]] = {}
        self._last_backward_s: float | None = None
        self._lock = threading.Lock()

    def snapshot(self) -> tuple[int, int]:
        return self.calls, self.nodes

    def entered(self) -> tuple[int, str | None]:
        """(calls so far, the block entered last): what a heartbeat writes of the blocks
        (nsadiag.harness.heartbeat ``count_blocks``)."""
        return self.calls, self.block

    def block_hook(self, name: str, stands_for: int = 1) -> Callable[[Any, Any], None]:
        """A forward pre-hook for one block of the watched model: counts its call in
        ``calls`` (as ``stands_for`` block calls: a block watched for the unhooked ones
        after it, nsadiag.harness.thinning) and leaves its name in ``block``, and nothing
        more (the heartbeat writes the counts at a bounded rate). Inside code torch.compile
        traces it does nothing, as ``outside_compiled_code`` would make it, without that
        wrapper's second call: a model of many small blocks runs it at every block call."""
        import torch

        is_compiling = torch.compiler.is_compiling

        def enter(module: Any, args: Any) -> None:
            if is_compiling():
                return
            if _PENDING:
                skip_dynamo_frames()
            self.calls += stands_for
            self.block = name

        _skip_in_dynamo(enter.__code__)
        return enter

    # ---- installing -----------------------------------------------------------------------

    def install(self, count_calls: bool = True) -> WorkCounters:
        """Start counting (idempotent); ``remove`` undoes it. Without ``count_calls`` no
        global module hook is installed: the caller counts ``calls`` itself."""
        import torch
        from torch.nn.modules import module as module_mod

        with self._lock:
            if self._originals:
                return self
            if count_calls:
                self._handles.append(module_mod.register_module_forward_pre_hook(
                    outside_compiled_code(self._on_call)))
            for name in ("backward", "grad"):
                original = getattr(torch.autograd, name)
                self._originals[name] = original
                setattr(torch.autograd, name, self._wrap(original))
        return self

    def remove(self) -> None:
        import torch

        with self._lock:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            for name, original in self._originals.items():
                setattr(torch.autograd, name, original)
            self._originals.clear()

    def _on_call(self, module: Any, args: Any) -> None:
        self.calls += 1

    # ---- backward -------------------------------------------------------------------------

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` (torch.autograd.backward or grad), counted when run eagerly and
        left to Dynamo as it is when a compiled function calls it. Under Dynamo's frame
        callback (a backward after a graph break in a compiled step) the wrapper's own
        frames are skipped, and the backward it runs is seen by Dynamo as without it."""
        import torch

        is_compiling = torch.compiler.is_compiling

        def counted(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if is_compiling():
                return original(tensors, *args, **kwargs)
            handles, started = self._backward_starts(tensors)
            if _PENDING:
                skip_dynamo_frames()
            try:
                return original(tensors, *args, **kwargs)
            finally:
                self._backward_ends(handles, started)

        _skip_in_dynamo(counted.__code__, recursive=False)
        for part in (self._backward_starts, self._backward_ends, self._tick("")):
            _skip_in_dynamo(part.__code__)
        wrapper = functools.wraps(original)(counted)
        wrapper.__nsadiag_counted__ = True  # type: ignore[attr-defined]
        return wrapper

    def _backward_starts(self, tensors: Any) -> tuple[list[Any], float]:
        if self.on_backward is not None:
            self.on_backward()
        handles = self._hook_graph(tensors) if self._should_instrument() else []
        self.op = None  # a name from an earlier backward would be stale
        self.in_backward += 1
        return handles, time.perf_counter()

    def _backward_ends(self, handles: list[Any], started: float) -> None:
        self.in_backward -= 1
        self.op = None
        self._last_backward_s = time.perf_counter() - started
        for handle in handles:
            handle.remove()

    def _should_instrument(self) -> bool:
        last = self._last_backward_s
        return last is None or last >= LONG_BACKWARD_S

    def _hook_graph(self, tensors: Any) -> list[Any]:
        # A hook removed through its handle leaves torch's hook wrapper on the node, run at
        # every backward that node takes part in. The other nodes are made anew by each
        # forward, but a parameter's AccumulateGrad node lives on from step to step (the
        # last step's graph holds it while the next forward reuses it), so a hook once on
        # it would cost every later backward: 3 to 4.5 % of the step of a model of 64 small
        # blocks, measured as the steps after one hooked backward over the steps before.
        nodes = [node for node in graph_nodes(tensors) if not _lives_on(node)]
        stride = max(1, -(-len(nodes) // MAX_HOOKS))
        handles = []
        for node in nodes[::stride]:
            try:
                handles.append(node.register_prehook(self._tick(node.name())))
            except (RuntimeError, AttributeError):
                continue  # a node type that takes no hooks
        return handles

    def _tick(self, name: str) -> Callable[[Any], None]:
        def hook(grad_outputs: Any) -> None:
            self.nodes += 1
            self.op = name
        _skip_in_dynamo(hook.__code__)
        return hook


def _lives_on(node: Any) -> bool:
    """Whether an autograd node outlives its backward: a leaf's AccumulateGrad."""
    return type(node).__name__ == "AccumulateGrad"


def graph_nodes(tensors: Any) -> list[Any]:
    """The autograd nodes reachable from the grad_fn of ``tensors`` (a tensor or a
    sequence of them), depth first from the roots."""
    import torch

    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
    stack = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    nodes = []
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
    return nodes


def outside_compiled_code(hook: Callable[..., Any],
                          traced: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """``hook``, run only outside code that torch.compile traces: there it does nothing
    (returns None), or calls ``traced`` instead (the function a wrapper stands for).

    Dynamo inlines a module hook it meets in a compiled region, and an attribute the hook
    reads becomes a guard: ``self.calls += 1`` guarded on the count and recompiled the
    model on every call until Dynamo's recompile limit, and a file write breaks the graph.
    ``torch.compiler.is_compiling()`` is a constant True to Dynamo, so the traced hook is
    empty and guards nothing of ours; run eagerly it costs one call. Where Dynamo would
    compile the wrapper as a frame of its own (the global hooks of the module inside
    ``torch.compile(module)`` run under its frame callback), the wrapper and all it calls
    run as they are (``skip_dynamo_frames``)."""
    import torch

    is_compiling = torch.compiler.is_compiling

    @functools.wraps(hook)
    def eager_only(*args: Any, **kwargs: Any) -> Any:
        if is_compiling():
            return None if traced is None else traced(*args, **kwargs)
        if _PENDING:
            skip_dynamo_frames()
        return hook(*args, **kwargs)

    _skip_in_dynamo(eager_only.__code__)
    return eager_only


_PENDING: dict[Any, bool] = {}
"""Code of nsadiag's hooks that Dynamo's frame callback must skip: {code: recursive}."""
_DONE: set[Any] = set()


def _skip_in_dynamo(code: Any, recursive: bool = True) -> None:
    """Have Dynamo's frame callback skip frames of ``code`` (and, ``recursive``, every
    frame they call), once the program has imported Dynamo."""
    if code not in _DONE:
        _PENDING[code] = recursive


def skip_dynamo_frames() -> bool:
    """Once the program has imported Dynamo, have its frame callback run the frames of
    nsadiag's hooks as they are, as it runs torch's own code; whether that is done.
    (torch >= 2.6; before, Dynamo compiles such a frame once, and only to nothing.)
    nsadiag never imports Dynamo itself: that would load what the program does not, and
    race with the program's own import on another thread."""
    module = sys.modules.get("torch._dynamo")
    if module is None or getattr(module.__spec__, "_initializing", False):
        return False
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:
        set_code_exec_strategy = None
    for code, recursive in list(_PENDING.items()):
        if set_code_exec_strategy is not None:
            below = FrameAction.SKIP if recursive else FrameAction.DEFAULT
            set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, below))
        _DONE.add(code)
        _PENDING.pop(code, None)
    return True
