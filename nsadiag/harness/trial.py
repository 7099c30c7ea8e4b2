"""The "trial" job: train a target for spec.steps steps under the heartbeat.

Single process: steps of forward, backward and AdamW on random token ids
[batch, seq_len + 1] (next-token cross entropy, bf16 autocast when dtype is bfloat16).
As one rank of N: the target's loss is wrapped in DistributedDataParallel with a counting
allreduce comm hook, torch.distributed collectives are counted, each rank trains on its
rows [r*b, (r+1)*b) of a global batch [N*b, S + 1] drawn from spec.seed (N ranks of b rows
see what one process of N*b rows would), and the loss is averaged over the ranks.

Measured into ``Progress``: per-step phase times and loss, module events of step 0 (the
expected events per step), and what step 0's forward saved for backward, in all and per
NSA branch (the saved-tensor ledger, fed by the heartbeat's branch wrappers through
``BranchTee`` so the branches are wrapped once).

Step times are reported as medians of the steps after step 0 (which pays one-off costs).
A single process that was asked for fewer than 1 + MEDIAN_STEPS steps runs timing steps
after them, one at a time while the next one fits well inside the budget
(``timing_step_fits``), so the median covers MEDIAN_STEPS steps where the budget allows;
they are counted apart (``timing_steps``) and the verdict judges the asked steps only.
Ranks never do: every rank would have to agree on each extra step's collectives.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nsadiag.harness.heartbeat import HeartbeatWriter
from nsadiag.harness.rank import RankEnv

if TYPE_CHECKING:
    import torch
    from torch import nn

    from nsadiag.spec import TrialSpec
    from nsadiag.targets import Target

LEARNING_RATE = 1e-3
MEDIAN_STEPS = 3
"""Step times are the median of this many steps after step 0, where the budget allows."""
FINISH_MARGIN_S = 5.0
"""What a trial keeps of its budget after its last timing step: writing the result,
stopping the sampler, exiting."""


@dataclass
class Progress:
    """What the finished steps measured."""

    step_s: list[float] = field(default_factory=list)
    forward_s: list[float] = field(default_factory=list)
    backward_s: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    expected_events_per_step: int | None = None
    saved_bytes: int | None = None  # saved for backward by step 0's forward
    saved_by_branch: dict[str, int] | None = None  # the same, inside each NSA branch
    rates: dict[str, Any] = field(default_factory=dict)  # see Rates
    timing_steps: int = 0  # steps run after the asked ones, for the step-time median
    state_bytes: int | None = None  # parameters, gradients and optimizer state after step 0

    def to_dict(self) -> dict[str, Any]:
        """steps_done counts the asked steps; the lists hold every step, timing steps
        included."""
        return {"steps_done": len(self.step_s) - self.timing_steps,
                "timing_steps": self.timing_steps, "step_s": self.step_s,
                "forward_s": self.forward_s, "backward_s": self.backward_s,
                "loss": self.loss, "expected_events_per_step": self.expected_events_per_step,
                "saved_bytes": self.saved_bytes, "saved_by_branch": self.saved_by_branch,
                "state_bytes": self.state_bytes, **self.rates}


@dataclass
class Rates:
    """What the machine and a dense model of the target's shape achieve here
    (nsadiag.probes.efficiency), and the FLOPs of one step of the target (step 0,
    counted); every step event carries them with that step's efficiency."""

    machine_flops_per_s: float | None = None
    dense_efficiency: float | None = None
    dense_flops_per_op: float | None = None
    flops_per_step: int | None = None  # 3 x the forward's
    ops_per_step: int | None = None  # ops, compute ops and host reads of the forward
    compute_ops_per_step: int | None = None
    host_reads_per_step: int | None = None
    blocks: int | None = None  # the blocks the heartbeat watches
    unavailable: str | None = None
    dense_block_s: float | None = None  # the dense block's forward and backward here
    dense_shape: tuple[int, int] | None = None  # the (batch, length) it ran at: the
    # target's, cut to the reference's limit

    def expected_step_s(self, batch: int, seq_len: int, blocks: int | None) -> float | None:
        """What a step of ``blocks`` dense blocks of [batch, seq_len] tokens would take
        here: the dense block's time per block, scaled by the batch and by the square of
        the length where the reference ran smaller (an upper bound: attention's share grows
        with the length); None when the reference did not run or no block is watched."""
        if not self.dense_block_s or not self.dense_shape or not blocks:
            return None
        ran_batch, ran_length = self.dense_shape
        return (self.dense_block_s * blocks * max(1.0, batch / ran_batch) *
                max(1.0, seq_len / ran_length) ** 2)

    def count_forward(self, counted: Any, blocks: int | None) -> None:
        """Take a forward's WorkCount: a step is about three forwards of FLOPs (backward
        two); ops, compute ops and host reads are the forward's."""
        self.flops_per_step = 3 * counted.flops if counted.flops is not None else None
        self.ops_per_step, self.host_reads_per_step = counted.ops, counted.host_reads
        self.compute_ops_per_step, self.blocks = counted.compute_ops, blocks

    def for_step(self, step_s: float) -> dict[str, Any]:
        per_op = (self.flops_per_step / self.ops_per_step
                  if self.flops_per_step is not None and self.ops_per_step else None)
        fields: dict[str, Any] = {"machine_flops_per_s": self.machine_flops_per_s,
                                  "dense_efficiency": self.dense_efficiency,
                                  "dense_flops_per_op": self.dense_flops_per_op,
                                  "flops_per_step": self.flops_per_step,
                                  "ops_per_step": self.ops_per_step, "flops_per_op": per_op,
                                  "compute_ops_per_step": self.compute_ops_per_step,
                                  "blocks": self.blocks,
                                  "host_reads_per_step": self.host_reads_per_step}
        if self.flops_per_step is not None and self.machine_flops_per_s and step_s > 0:
            fields["efficiency"] = self.flops_per_step / step_s / self.machine_flops_per_s
        if self.unavailable:
            fields["rates_unavailable"] = self.unavailable
        return fields


def measure_rates(spec: TrialSpec, target: Target, device: torch.device) -> Rates:
    """The machine's matmul rate and the dense reference's efficiency; a failure leaves
    them unknown with the reason (the trial itself must not fail for them)."""
    import torch

    from nsadiag.probes.efficiency import dense_reference, matmul_rate, model_dim

    dtype = torch.bfloat16 if spec.dtype == "bfloat16" else torch.float32
    try:
        rates = Rates(machine_flops_per_s=matmul_rate(device, dtype))
        dim = model_dim(target.model)
        if dim:
            dense = dense_reference(spec.batch, spec.seq_len, dim, device, dtype)
            rates.dense_efficiency = dense["efficiency"]
            rates.dense_flops_per_op = dense["flops_per_op"]
            rates.dense_block_s = dense["seconds"]
            rates.dense_shape = (dense["batch"], dense["seq_len"])
            rates.machine_flops_per_s = dense["machine_flops_per_s"]  # the same rate as
            # the dense efficiency's, measured again after the reference
        return rates
    except Exception as exc:  # a reference that cannot run here decides nothing
        return Rates(unavailable=f"{type(exc).__name__}: {exc}")


class BranchTee:
    """The branch events of the heartbeat's BranchProbe, written as heartbeat events and
    passed on to the saved-tensor ledger while one is counting (step 0's forward)."""

    def __init__(self, writer: HeartbeatWriter):
        self.writer = writer
        self.ledger: Any = None

    def __call__(self, name: str, phase: str, edge: str) -> None:
        self.writer.module(name, phase, edge)
        if self.ledger is not None:
            self.ledger.branch_event(name, phase, edge)


def find_unused(spec: TrialSpec) -> bool:
    """DDP must look for unused parameters where the model leaves some without a gradient:
    the NSA selection branch alone scores blocks with the compression keys but never
    back-propagates into them."""
    branches = spec.branches or ()
    return spec.target == "nsa" and "sel" in branches and "cmp" not in branches


def loss_module(target: Target) -> nn.Module:
    """A module whose forward(ids [B, S + 1]) is the target's loss, so that DDP, which
    reduces only the work done inside its forward, wraps the whole loss."""
    from torch import nn

    class TargetLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = target.model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return target.loss(ids)

    return TargetLoss()


def device_of(model: nn.Module) -> torch.device:
    import torch

    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def timing_step_fits(step_s: list[float], elapsed_s: float, budget_s: float) -> bool:
    """Whether one more timing step is worth running and fits: fewer than
    1 + MEDIAN_STEPS steps ran, and twice the slowest step so far, plus FINISH_MARGIN_S,
    still ends inside the budget (``elapsed_s`` counts from the process start)."""
    if not step_s or len(step_s) >= 1 + MEDIAN_STEPS:
        return False
    return elapsed_s + 2 * max(step_s) + FINISH_MARGIN_S <= budget_s


def _process_started() -> float:
    """Unix time this process started (the parent's budget clock starts with it)."""
    import psutil

    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return time.time()


def train(spec: TrialSpec, target: Target, writer: HeartbeatWriter, progress: Progress,
          rank: RankEnv | None = None, collectives: Any = None) -> None:
    """spec.steps steps; measurements go to `progress`. `collectives` (a
    CollectiveCounter) counts DDP's buckets when running as a rank."""
    import torch

    from nsadiag.harness.heartbeat import hook_modules
    from nsadiag.harness.rank import mean_over_ranks, wrap_ddp

    device = device_of(target.model)
    loss_of = target.loss
    if rank is not None:
        ddp = wrap_ddp(loss_module(target), device, find_unused(spec))
        if collectives is not None:
            ddp.register_comm_hook(None, collectives.ddp_hook)
        loss_of = ddp
    world = rank.world_size if rank else 1
    rows = slice(rank.rank * spec.batch, (rank.rank + 1) * spec.batch) if rank else \
        slice(0, spec.batch)
    optimizer = torch.optim.AdamW(target.model.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(spec.seed)
    tee = BranchTee(writer)
    rates = measure_rates(spec, target, device)
    started = _process_started()
    step = 0
    with hook_modules(target, writer, tee):
        while step < spec.steps or (rank is None and timing_step_fits(
                progress.step_s, time.time() - started, spec.budget_s)):
            batch = torch.randint(target.vocab_size, (world * spec.batch, spec.seq_len + 1),
                                  generator=generator)
            before = writer.module_events
            timing = step >= spec.steps
            loss = run_step(spec, target.model, loss_of, optimizer, batch[rows].to(device),
                            step, writer, progress, tee, rates, timing=timing)
            if step == 0:
                progress.expected_events_per_step = writer.module_events - before
                progress.state_bytes = model_state_bytes(target.model, optimizer)
            progress.timing_steps += timing
            progress.loss.append(mean_over_ranks(loss, device, world) if rank else loss)
            step += 1


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes the training state holds whatever the activations: parameters, their
    gradients and the optimizer's state tensors (AdamW: two per parameter). Part of every
    peak, and linear in the layer count."""
    import torch

    tensors = list(model.parameters()) + \
        [p.grad for p in model.parameters() if p.grad is not None] + \
        [t for state in optimizer.state.values() for t in state.values()
         if isinstance(t, torch.Tensor)]
    seen, total = set(), 0
    for tensor in tensors:
        if tensor.data_ptr() not in seen:  # tied weights count once
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


@contextlib.contextmanager
def _forward_context(ledger: Any, counted: Any) -> Iterator[None]:
    """The saved-tensor ledger and the work count around one forward, either or both."""
    from nsadiag.probes.efficiency import count_work

    with contextlib.ExitStack() as stack:
        if ledger is not None:
            stack.enter_context(ledger)
        if counted is not None:
            stack.enter_context(count_work(counted))
        yield


def run_step(spec: TrialSpec, model: nn.Module, loss_of: Any, optimizer: torch.optim.Optimizer,
             ids: torch.Tensor, step: int, writer: HeartbeatWriter, progress: Progress,
             tee: BranchTee | None = None, rates: Rates | None = None,
             timing: bool = False) -> float:
    """One step (nsadiag.harness.step) with a "start" event per phase and a "step" event
    at its end (marked ``timing`` for a step run only for the step-time median); step 0's
    forward runs under the saved-tensor ledger, and with ``rates`` step 0 counts its
    FLOPs. Returns the loss."""
    from nsadiag.harness.step import train_step
    from nsadiag.probes.efficiency import WorkCount
    from nsadiag.probes.memory import SavedTensorLedger

    ledger = SavedTensorLedger(model, branches=False) if step == 0 else None

    def on_phase(phase: str) -> None:
        if phase == "backward" and ledger is not None:
            progress.saved_bytes = ledger.total
            progress.saved_by_branch = ledger.by_branch()
            counts: dict[str, Any] = {}
            if counted is not None:  # the counted forward has just ended
                rates.count_forward(counted, writer.watched_blocks)
                counts = rates.for_step(0.0)
            writer.start(phase, step, saved_bytes=ledger.total,
                         saved_by_branch=progress.saved_by_branch, **counts)
            if tee is not None:
                tee.ledger = None
            return
        expected = rates.expected_step_s(spec.batch, spec.seq_len, writer.watched_blocks) \
            if rates is not None and phase == "forward" else None
        writer.start(phase, step, **({"expected_step_s": expected} if expected else {}))
        if phase == "forward" and tee is not None:
            tee.ledger = ledger

    # step 0's forward only: counting costs microseconds per op, and a backward of many
    # small nodes under it would stand still long enough to look stalled
    counted = WorkCount() if rates is not None and step == 0 and not rates.unavailable \
        else None
    try:
        loss, times = train_step(loss_of, ids, optimizer, bfloat16=spec.dtype == "bfloat16",
                                 on_phase=on_phase,
                                 forward_context=_forward_context(ledger, counted))
    finally:
        if tee is not None:
            tee.ledger = None
    extra = rates.for_step(times.step_s) if rates is not None else {}
    if rates is not None:
        progress.rates = extra
    if timing:
        extra = {**extra, "timing": True}
    writer.step_done(step_s=times.step_s, forward_s=times.forward_s,
                     backward_s=times.backward_s, **extra)
    progress.step_s.append(times.step_s)
    progress.forward_s.append(times.forward_s)
    progress.backward_s.append(times.backward_s)
    return float(loss)
