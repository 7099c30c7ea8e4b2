"""Autograd timeline: when each module's forward and backward ran, and when each
parameter's gradient arrived, for one training step.

`AutogradTracer(model)` is a context manager. While it is open, hooks record events as
plain tuples `(perf_counter_ns, kind, index)` into a preallocated list (grown only when
full); nothing is formatted, synchronised or allocated beyond the tuple inside a hook.
Formatting happens afterwards, in `timeline()`, `chrome_trace()` and the checks.

Hooks per traced module (every named module except the root, or the names given):
forward pre hook and forward hook (always_call, so a forward that raises still closes),
full backward pre hook (the gradient of the module's output arrived: its backward starts)
and full backward hook (the gradient of its inputs is ready: its backward ended). Per
parameter with requires_grad: a post-accumulate-grad hook (the gradient landed in .grad).

Autograd sums every contribution to a leaf before accumulating it, so a weight used twice
in one graph is accumulated once. `repeated_gradients()` therefore counts, per step, the
larger of (a) accumulations into .grad (several graphs or backward calls feeding one step,
e.g. a reentrant checkpoint recompute plus a use outside it) and (b) completed backward
passes of calls of the module that owns the parameter directly (one per forward call).

CUDA work is asynchronous: on a GPU the times are when the host issued the work, not when
the device ran it; no hook synchronises.

`ProfilerSpans(model)` opens a ``torch.profiler.record_function`` range for every module's
forward and backward (the same spans, NSA branches included), so a step recorded under
``torch.profiler`` shows the modules around the operators they ran in one trace.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

FWD_START, FWD_END, BWD_START, BWD_END, GRAD, STEP = range(6)
PHASES = {FWD_START: "forward", BWD_START: "backward"}
TID = {"forward": 1, "backward": 2, "grad": 3}
THREAD_NAMES = {1: "module forward", 2: "module backward", 3: "gradient arrivals"}


class AutogradTracer:
    """Context manager over one (or more, split by `step()`) training step(s)."""

    def __init__(self, model: nn.Module, modules: Iterable[str] | None = None,
                 capacity: int = 65536):
        self.model = model
        named = dict(model.named_modules())
        wanted = [n for n in named if n] if modules is None else list(modules)
        missing = [n for n in wanted if n not in named]
        if missing:
            raise ValueError(f"trace: no module named {', '.join(map(repr, missing))}")
        self.module_names: list[str] = wanted
        self._modules = [named[n] for n in wanted]
        self.param_names: list[str] = []
        self._params: list[torch.Tensor] = []
        for name, param in model.named_parameters():
            if param.requires_grad:
                self.param_names.append(name)
                self._params.append(param)
        # direct (recurse=False) trainable parameters of each traced module, as indices
        index = {id(p): i for i, p in enumerate(self._params)}
        self._owned: list[list[int]] = [
            [index[id(p)] for p in m.parameters(recurse=False) if id(p) in index]
            for m in self._modules]
        self._events: list[Any] = [None] * capacity
        self._n = 0
        self._handles: list[Any] = []
        self.t0_ns = 0
        self.t1_ns = 0
        self._warnings: Any = None

    # ---- recording -------------------------------------------------------------------

    def __enter__(self) -> AutogradTracer:
        self._n = 0
        # a module whose inputs need no gradient (an embedding of int ids) ends its backward
        # as soon as it starts; torch warns about that on every call, which is expected here
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        self.t0_ns = time.perf_counter_ns()
        for i, module in enumerate(self._modules):
            self._handles += [
                module.register_forward_pre_hook(self._hook(FWD_START, i)),
                module.register_forward_hook(self._hook(FWD_END, i), always_call=True),
                module.register_full_backward_pre_hook(self._hook(BWD_START, i)),
                module.register_full_backward_hook(self._hook(BWD_END, i)),
            ]
        for j, param in enumerate(self._params):
            self._handles.append(param.register_post_accumulate_grad_hook(self._hook(GRAD, j)))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.t1_ns = time.perf_counter_ns()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._warnings is not None:
            self._warnings.__exit__(*exc)
            self._warnings = None

    def step(self) -> None:
        """Mark a step boundary: gradient counts are per step."""
        self._record(STEP, -1)

    def _record(self, kind: int, index: int) -> None:
        n = self._n
        if n == len(self._events):
            self._events.extend([None] * len(self._events))
        self._events[n] = (time.perf_counter_ns(), kind, index)
        self._n = n + 1

    def _hook(self, kind: int, index: int):
        record = self._record

        def hook(*args: Any) -> None:
            record(kind, index)
        return hook

    # ---- analysis --------------------------------------------------------------------

    @property
    def events(self) -> list[tuple[int, int, int]]:
        """The raw events recorded: (perf_counter_ns, kind, module or parameter index)."""
        return self._events[:self._n]

    def _spans(self) -> tuple[list[tuple[str, str, int, int]], list[tuple[str, int]]]:
        """Closed spans (module, phase, start_ns, end_ns) and open backward starts."""
        open_: dict[tuple[int, int], list[int]] = {}
        spans = []
        for t, kind, i in self.events:
            if kind in (FWD_START, BWD_START):
                open_.setdefault((kind, i), []).append(t)
            elif kind in (FWD_END, BWD_END):
                stack = open_.get((kind - 1, i))
                if stack:
                    spans.append((self.module_names[i], PHASES[kind - 1], stack.pop(), t))
        unfinished = [(self.module_names[i], t) for (kind, i), starts in open_.items()
                      if kind == BWD_START for t in starts]
        return spans, unfinished

    def _us(self, t_ns: int) -> float:
        return round((t_ns - self.t0_ns) / 1000, 3)

    def timeline(self) -> list[dict[str, Any]]:
        """Finished forward/backward spans, sorted by start (times in us from entry)."""
        spans, _ = self._spans()
        spans.sort(key=lambda s: s[2])
        return [{"module": m, "phase": phase, "start_us": self._us(s), "end_us": self._us(e),
                 "duration_us": round((e - s) / 1000, 3)} for m, phase, s, e in spans]

    def chrome_trace(self, process_name: str = "nsadiag trace") -> dict[str, Any]:
        """Chrome trace-event JSON (opens in Perfetto / chrome://tracing).

        Forward spans on tid 1, backward on tid 2 (an unfinished backward runs to the end
        of the trace, category "backward-unfinished"), gradient arrivals as instant events
        on tid 3; metadata events ("M") name the process and the three threads."""
        pid = os.getpid()
        spans, unfinished = self._spans()
        end = self.t1_ns or (self.events[-1][0] if self._n else self.t0_ns)
        out = [{"name": m, "ph": "X", "ts": self._us(s), "dur": round((e - s) / 1000, 3),
                "pid": pid, "tid": TID[phase], "cat": phase} for m, phase, s, e in spans]
        out += [{"name": m, "ph": "X", "ts": self._us(s), "dur": round((end - s) / 1000, 3),
                 "pid": pid, "tid": TID["backward"], "cat": "backward-unfinished"}
                for m, s in unfinished]
        out += [{"name": self.param_names[j], "ph": "i", "s": "t", "ts": self._us(t),
                 "pid": pid, "tid": TID["grad"], "cat": "grad"}
                for t, kind, j in self.events if kind == GRAD]
        out.sort(key=lambda e: e["ts"])
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                 "args": {"name": process_name}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                  "args": {"name": name}} for tid, name in THREAD_NAMES.items()]
        meta += [{"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                  "args": {"sort_index": tid}} for tid in THREAD_NAMES]
        return {"traceEvents": meta + out, "displayTimeUnit": "ms"}

    def _per_step_counts(self) -> list[tuple[list[int], list[int]]]:
        """Per step: (accumulations per parameter, finished owner backwards per parameter)."""
        steps = []
        arrivals = [0] * len(self._params)
        uses = [0] * len(self._params)
        for _, kind, i in self.events:
            if kind == GRAD:
                arrivals[i] += 1
            elif kind == BWD_END:
                for j in self._owned[i]:
                    uses[j] += 1
            elif kind == STEP:
                steps.append((arrivals, uses))
                arrivals = [0] * len(self._params)
                uses = [0] * len(self._params)
        steps.append((arrivals, uses))
        return steps

    def unused_parameters(self) -> list[str]:
        """Trainable parameters that received no gradient in the traced step(s)."""
        got = [0] * len(self._params)
        for _, kind, j in self.events:
            if kind == GRAD:
                got[j] += 1
        return [name for name, n in zip(self.param_names, got, strict=True) if n == 0]

    def repeated_gradients(self) -> dict[str, int]:
        """{parameter: contributions} where one step gave a parameter more than one
        gradient (see the module docstring for what counts)."""
        worst: dict[str, int] = {}
        for arrivals, uses in self._per_step_counts():
            for j, name in enumerate(self.param_names):
                count = max(arrivals[j], uses[j])
                if count > 1 and count > worst.get(name, 0):
                    worst[name] = count
        return worst

    def unfinished_backward(self) -> list[str]:
        """Modules whose backward started and never ended, innermost (latest start) first."""
        _, unfinished = self._spans()
        unfinished.sort(key=lambda u: -u[1])
        seen: list[str] = []
        for name, _ in unfinished:
            if name not in seen:
                seen.append(name)
        return seen


class ProfilerSpans:
    """Context manager: while open, every named module's forward and backward run inside a
    ``torch.profiler.record_function`` range named "<module> forward" / "<module>
    backward", and so does every NSA branch call of the built-in model ("blocks.0.attn.sel
    forward", from the branch wrappers of nsadiag.targets.BranchProbe); torch.profiler
    records them beside the operators. Ranges of one module nest like its calls (a stack
    per module and phase); a forward that raises still closes its range."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._modules = [(name, module) for name, module in model.named_modules() if name]
        self._handles: list[Any] = []
        self._open: dict[tuple[str, str], list[Any]] = {}
        self._warnings: Any = None
        self._branches: Any = None

    def _open_range(self, name: str, phase: str) -> None:
        rf = torch.autograd.profiler.record_function(f"{name} {phase}")
        rf.__enter__()
        self._open.setdefault((name, phase), []).append(rf)

    def _close_range(self, name: str, phase: str) -> None:
        stack = self._open.get((name, phase))
        if stack:
            stack.pop().__exit__(None, None, None)

    def _start(self, name: str, phase: str):
        def hook(*args: Any) -> None:
            self._open_range(name, phase)
        return hook

    def _end(self, name: str, phase: str):
        def hook(*args: Any) -> None:
            self._close_range(name, phase)
        return hook

    def _branch_event(self, name: str, phase: str, edge: str) -> None:
        if edge == "enter":
            self._open_range(name, phase)
        else:
            self._close_range(name, phase)

    def __enter__(self) -> ProfilerSpans:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for name, module in self._modules:
            self._handles += [
                module.register_forward_pre_hook(self._start(name, "forward")),
                module.register_forward_hook(self._end(name, "forward"), always_call=True),
                module.register_full_backward_pre_hook(self._start(name, "backward")),
                module.register_full_backward_hook(self._end(name, "backward")),
            ]
        from nsadiag.builtin import nsa_attention_class

        nsa_attention = nsa_attention_class()
        if nsa_attention is not None and any(isinstance(m, nsa_attention)
                                             for m in self.model.modules()):
            from nsadiag.targets import BranchProbe

            self._branches = BranchProbe(self.model, self._branch_event)
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._branches is not None:
            self._branches.remove()
            self._branches = None
        for stack in self._open.values():  # a backward that never ended
            while stack:
                stack.pop().__exit__(None, None, None)
        if self._warnings is not None:
            self._warnings.__exit__(*exc)
            self._warnings = None
