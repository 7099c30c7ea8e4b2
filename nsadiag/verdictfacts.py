"""A verdict's facts, typed: one frozen dataclass per family of facts, grouped in
VerdictFacts, which ``Verdict.facts`` holds.

The rules assemble their facts in a plain dict (nsadiag.verdict.rules and its helpers) and
the Verdict parses it once (``VerdictFacts.of``); a stored record's facts are parsed once
where the record is read (``VerdictFacts.from_dict``). Readers then use attributes
(``facts.slow.eta_s``), never string keys.

Each field is named as its key in record.json, and each key belongs to one family, so the
JSON form stays flat: ``to_dict`` writes the keys of every family, leaving out those that are
None (a fact not recorded), in the order they were given.

The facts of a correctness check (nsadiag.checks) are the check's own figures besides its
name, module and budget fit: they are kept as they are (CheckFacts.figures).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar, Union


class FactsError(ValueError):
    """A verdict's facts that are not what their family holds: a value of the wrong type,
    or (when the rules build them) a key no family has. One line naming the key."""


Part = TypeVar("Part")


def _part(cls: type[Part], data: Any, what: str) -> Part:
    """A nested fact of class ``cls`` from its JSON object ``data``: each field but ``raw``
    read from the key of its name (None when missing), type-checked; ``raw`` keeps the
    whole object, so ``to_dict`` writes it back as it was."""
    if not isinstance(data, Mapping):
        raise FactsError(f"facts.{what}: {data!r} is not an object")
    values: dict[str, Any] = {"raw": dict(data)}
    for name, hint in typing.get_type_hints(cls).items():
        if name != "raw":
            values[name] = _parsed(f"{what}.{name}", hint, data.get(name))
    return cls(**values)


@dataclass(frozen=True)
class Load:
    """The machine's load while the job ran (nsadiag.verdict.load.contention), the figures
    readers quote; ``raw`` is the whole record of it."""

    load_per_cpu: float
    contended: bool
    got: float | None
    raw: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(frozen=True)
class RankRow:
    """One rank of a job's table (nsadiag.verdict.ranks.rank_table; a live window's rows
    carry cpu_fraction, collective and user_frame instead of the collective counts)."""

    rank: int | None
    host: str | None
    local_rank: int | str | None  # as the launcher's environment named it
    node_rank: int | str | None
    pid: int | None
    state: str | None
    issued: int | None
    last_collective: str | None
    waiting: str | None
    waiting_since_s: float | None
    position: str | None
    cpu_fraction: float | None
    collective: str | None
    user_frame: str | None
    memory_per_step: float | None
    memory_holder: str | None
    folded: str | None  # a group folded at a stall: "1,022 ranks (1-1022) as rank 0"
    raw: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(frozen=True)
class StragglerFact:
    """The straggler a job's verdict names: the slow rank's object as the straggler rule
    wrote it (nsadiag.verdict.straggler.Straggler.to_dict: its figures and the sentence
    that says them) and, from a host's shared view, when its latest read named it
    (``seen_at``, a UNIX time; None otherwise). The fields are what readers quote; ``raw``
    is the whole object, so ``to_dict`` writes it back as it was."""

    rank: int
    label: str
    host: str | None
    ratio: float | None
    sentence: str
    seen_at: float | None
    raw: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)

    @classmethod
    def from_dict(cls, data: Any) -> StragglerFact:
        """FactsError for an object without a rank, label or sentence, or with a field of
        the wrong type."""
        return _part(cls, data, "straggler")


@dataclass(frozen=True)
class Worker:
    """A DataLoader worker a data-bound SLOW names (nsadiag.verdict.slow_cause)."""

    where: str | None
    code: str | None
    samples: int | None
    active: int | None
    in_own: int | None
    raw: Mapping[str, Any]


@dataclass(frozen=True)
class SlowCause:
    """A SLOW run's cause class (nsadiag.verdict.slow_cause): its kind, its share of the
    samples, the user lines it names, and the figures each class carries."""

    kind: str
    share: float | None
    samples: int | None
    of_samples: int | None
    backward_share: float | None
    recompiles: int | None
    steps: int | None
    size_dim: int | None
    asked_at: str | None
    called_at: str | None
    loaded_at: str | None
    inner: str | None
    guard: str | None
    function: str | None
    sentence: str | None
    workers: tuple[Worker, ...] | None
    raw: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(frozen=True)
class Crash:
    """What a process left when it died (nsadiag.harness.crash.read): readers quote the
    frame and the native call it died in; ``raw`` keeps the rest (error, signal, stderr)."""

    where: str | None
    call: str | None
    raw: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(frozen=True)
class ChainHop:
    """One hop of a wait chain (nsadiag.verdict.chain.Hop), as stored."""

    kind: str | None
    where: str | None
    raw: Mapping[str, Any]


@dataclass(frozen=True)
class Chain:
    """A stuck run's wait chain as stored (nsadiag.verdict.chain.WaitChain.to_dict): its
    hops, first the waiting thread, its end and its printed form; ``raw`` parses back
    into a WaitChain."""

    end: str | None
    subject: str | None
    printed: str | None
    hops: tuple[ChainHop, ...] | None
    raw: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)


@dataclass(frozen=True)
class PositionFacts:
    """Where the run stood and how it ended, shared by every verdict: its last module
    heartbeat, steps and events counted, its wall time, the state a live window names, the
    machine's load, an interruption, and for INCONCLUSIVE what it would otherwise be."""

    events_total: int | None = None
    steps_done: int | dict[str, Any] | None = None  # a job of ranks: each rank's steps
    last_module: str | None = None
    last_edge: str | None = None
    last_phase: str | None = None
    last_step: int | None = None
    last_rss: int | None = None
    wall_s: float | None = None
    timing_steps: int | None = None
    budget_kill: bool | None = None
    state: str | None = None
    heartbeat_progress: int | None = None
    since_last_event_s: float | None = None
    confidence: str | None = None
    would_be: str | None = None
    contended: bool | None = None
    cause: str | None = None
    load: Load | None = None
    interrupted: dict[str, Any] | None = None


@dataclass(frozen=True)
class HotFacts:
    """Where the samples or the sampled profile found the time: the hot frame, the frame at
    the kill, the hottest user line and its loop."""

    hot_frame: str | None = None
    hot_function: str | None = None
    hot_count: int | None = None
    native_below: bool | None = None
    kill_frame: str | None = None
    kill_count: int | None = None
    hot_line: str | None = None
    loop: dict[str, Any] | None = None
    hot_share: float | None = None
    hot_code: str | None = None
    hot_source: str | None = None
    distinct_stacks: int | None = None


@dataclass(frozen=True)
class SlowFacts:
    """A SLOW run: its rate and ETA, the loop counter's position, the counted work and
    whether it is slow by size or by defect, its cause class."""

    rate: float | None = None
    rate_window_s: float | None = None
    fraction_done: float | None = None
    eta_s: float | None = None
    events_done: int | None = None
    events_expected: int | None = None
    fraction_basis: str | None = None
    loop_position: dict[str, Any] | None = None
    step_s: float | None = None
    efficiency: float | None = None
    dense_efficiency: float | None = None
    flops_per_step: float | None = None
    machine_flops_per_s: float | None = None
    slow_by: str | None = None
    slow_findings: list[Any] | None = None
    host_reads_per_step: int | None = None
    flops_per_op: float | None = None
    slowness: dict[str, Any] | None = None
    slow_cause: SlowCause | None = None
    still_starting: bool | None = None


@dataclass(frozen=True)
class StallFacts:
    """A stuck run: the stall window's CPU, its samples, the frame it waits or spins in,
    its wait chain, what the other processes of the job were doing."""

    cpu_delta_s: float | None = None
    window_s: float | None = None
    cpu_fraction: float | None = None
    demand: float | None = None
    samples: int | None = None
    stacks_changed: bool | None = None
    unavailable: list[Any] | None = None
    collective: str | None = None
    collective_frame: str | None = None
    wait_frame: str | None = None
    wait_function: str | None = None
    wait_caller: str | None = None
    stacks_class: str | None = None
    native_call: str | None = None  # a busy stall's native function under the user's line
    thread: str | None = None
    wait_chain: Chain | None = None
    rank_chain: dict[str, Any] | None = None
    compiling: dict[str, Any] | None = None
    thread_exceptions: list[Any] | None = None
    others: list[Any] | None = None
    held_by: dict[str, Any] | None = None


@dataclass(frozen=True)
class RankFacts:
    """A job of ranks: the rank in focus, the table of every rank, the ranks that differ,
    where their collectives diverged, and across hosts the hosts and a straggler."""

    rank: int | None = None
    world_size: int | None = None
    ranks: tuple[RankRow, ...] | None = None
    odd_ranks: list[Any] | None = None
    diverged_at: int | None = None
    waiting: dict[str, Any] | None = None
    pg_timeout: bool | None = None
    collectives_issued: dict[str, Any] | None = None
    culprit_ranks: list[Any] | None = None
    hosts: dict[str, Any] | None = None
    waiting_for: list[Any] | None = None
    lost_hosts: list[Any] | None = None
    straggler: StragglerFact | None = None


@dataclass(frozen=True)
class MemoryFacts:
    """Memory: the peaks, the cap, the growth per step and the frame that holds it."""

    peak_rss: int | None = None
    peak_cuda: int | None = None
    memory_cap_bytes: int | None = None
    rss_growth_per_step: float | None = None
    cuda_alloc_growth_per_step: float | None = None
    rss_holder: str | None = None
    cuda_holder: str | None = None


@dataclass(frozen=True)
class CrashFacts:
    """How the process ended without finishing: the signal and the crash it left, or the
    exception it raised (and which known error it is), or its exit code."""

    signal: int | None = None
    signal_name: str | None = None
    crash: Crash | None = None
    exception_type: str | None = None
    message: str | None = None
    where: str | None = None
    known_error: str | None = None  # a known error's name (nsadiag.verdict.known)
    exit_code: int | None = None
    result_status: str | None = None


@dataclass(frozen=True)
class CheckFacts:
    """A correctness check's verdict (nsadiag.checks): its name and module, how its budget
    was fitted, and the check's own figures (kept as it wrote them)."""

    check: str | None = None
    module: str | None = None
    fitted: dict[str, Any] | None = None
    layers: int | None = None  # the blocks the check's model had (nsadiag.harness.child)
    applicable: bool | None = None  # False: the check does not apply to this model
    figures: Mapping[str, Any] = field(default_factory=dict)


_NESTED = (Load, RankRow, StragglerFact, Worker, SlowCause, Crash, ChainHop, Chain)
"""The nested facts readers index into, each parsed by ``_part``."""

_FAMILIES: dict[str, type] = {"position": PositionFacts, "hot": HotFacts, "slow": SlowFacts,
                              "stall": StallFacts, "ranks": RankFacts, "memory": MemoryFacts,
                              "crash": CrashFacts, "check": CheckFacts}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, globals())


_HINTS = {family: _hints(cls) for family, cls in _FAMILIES.items()}
_FAMILY_OF = {name: family for family, hints in _HINTS.items() for name in hints
              if name != "figures"}
"""Each key of the JSON form -> the family whose field it is."""


def _accepts(hint: Any, value: Any) -> bool:
    """Whether ``value`` (parsed JSON, or what a rule put there) is of type ``hint``."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_accepts(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint in _NESTED:
        return isinstance(value, (hint, Mapping))
    if origin is tuple:
        inner = typing.get_args(hint)[0]
        return isinstance(value, (list, tuple)) and all(_accepts(inner, v) for v in value)
    kind = origin or hint
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is dict:
        return isinstance(value, Mapping)
    return isinstance(value, kind)


def _parsed(key: str, hint: Any, value: Any) -> Any:
    if not _accepts(hint, value):
        raise FactsError(f"facts.{key}: {value!r} is not of type "
                         f"{str(hint).replace('typing.', '')}")
    if isinstance(value, Mapping) and typing.get_args(hint) and \
            any(arg in _NESTED for arg in typing.get_args(hint)):
        nested = next(arg for arg in typing.get_args(hint) if arg in _NESTED)
        return _part(nested, value, key)
    if value is not None and typing.get_origin(_without_none(hint)) is tuple:
        inner = typing.get_args(_without_none(hint))[0]
        return tuple(_part(inner, v, f"{key}[{i}]") if isinstance(v, Mapping) else v
                     for i, v in enumerate(value))
    return value


def _without_none(hint: Any) -> Any:
    """``X`` of ``X | None``."""
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    return args[0] if typing.get_origin(hint) in (Union, types.UnionType) and \
        len(args) == 1 else hint


@dataclass(frozen=True)
class VerdictFacts:
    """The numbers and names behind a verdict's reasons, by family (each None when not
    recorded)."""

    position: PositionFacts = field(default_factory=PositionFacts)
    hot: HotFacts = field(default_factory=HotFacts)
    slow: SlowFacts = field(default_factory=SlowFacts)
    stall: StallFacts = field(default_factory=StallFacts)
    ranks: RankFacts = field(default_factory=RankFacts)
    memory: MemoryFacts = field(default_factory=MemoryFacts)
    crash: CrashFacts = field(default_factory=CrashFacts)
    check: CheckFacts = field(default_factory=CheckFacts)
    order: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """The keys in the order they were given: ``to_dict`` writes them so, and a stored
    record reads back as the same JSON text."""

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> VerdictFacts:
        """The facts a rule assembled; FactsError for a key no family has (a rule's
        fact that would otherwise be lost) or a value of the wrong type."""
        return cls._parse(data, strict=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VerdictFacts:
        """The facts of a stored record; FactsError for a value of the wrong type. A key
        no family has (written by another nsadiag) is left out."""
        return cls._parse(data, strict=False)

    @classmethod
    def _parse(cls, data: Mapping[str, Any], strict: bool) -> VerdictFacts:
        if not isinstance(data, Mapping):
            raise FactsError(f"facts: {type(data).__name__} is not an object")
        by_family: dict[str, dict[str, Any]] = {family: {} for family in _FAMILIES}
        figures: dict[str, Any] = {}
        is_check = data.get("check") is not None
        for key, value in data.items():
            family = _FAMILY_OF.get(key)
            if family is None:
                if is_check:
                    figures[key] = value
                elif strict:
                    raise FactsError(f"facts.{key}: not a fact of any family "
                                     f"(nsadiag.verdictfacts)")
                continue
            if value is not None:
                by_family[family][key] = _parsed(key, _HINTS[family][key], value)
        if figures:
            by_family["check"]["figures"] = figures
        return cls(**{family: _FAMILIES[family](**values)
                      for family, values in by_family.items()},
                   order=tuple(key for key in data if key in _FAMILY_OF or key in figures))

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON form: every family's keys that are not None, in the order they
        were given (``order``), then any other in the order of the families' fields."""
        data: dict[str, Any] = {}
        for family in _FAMILIES:
            part = getattr(self, family)
            for item in fields(part):
                value = getattr(part, item.name)
                if item.name == "figures":
                    data.update(value)
                elif value is not None:
                    data[item.name] = _plain(value)
        given = {key: data.pop(key) for key in self.order if key in data}
        return {**given, **data}

    def with_facts(self, **changes: Any) -> VerdictFacts:
        """These facts with ``changes`` (keys of the JSON form; None removes one)."""
        return VerdictFacts.of({**self.to_dict(), **changes})

    def __bool__(self) -> bool:
        """Whether any fact was recorded (as a dict of them would be)."""
        return self != VerdictFacts()


def _plain(value: Any) -> Any:
    """The JSON form of a fact: a nested fact's object as it was read, a tuple of them a
    list."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    raw = getattr(value, "raw", None)
    return dict(raw) if raw is not None and not isinstance(value, Mapping) else value


def family_of(key: str) -> str | None:
    """The family whose field ``key`` is; None for a key no family has."""
    return _FAMILY_OF.get(key)
