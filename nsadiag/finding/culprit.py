"""The user line a trial's evidence blames: the defect's line, not the hottest healthy one.

Each verdict has its own witness, and the line comes from it:

    SLOW         the loop the sampled profile saw iterating (its counter advanced, read
                 from the program, so load cannot make it up): the whole ``for`` statement
                 that counts that variable; without a counter, the loop around the
                 hottest lines of the forward or backward. A line that sits in no loop is
                 no witness of a per-token defect, however hot: a healthy MLP is the
                 hottest line of a model whose real cost is elsewhere half the time.
                 A SLOW whose work was not counted (a user's script) names a loop only
                 from its counter. The training loop (its body calls backward or an
                 optimizer step) is never the slow loop: its steps are the run's work.
    STALL-BUSY   in Python, the loop the stall samples spin in (the whole ``while``); in one
                 native call, the user line that made it
    DEADLOCK     the frame the waiting thread blocks in (``with lock:``)
    STALL-COLLECTIVE  the user line of the odd rank that issued the collective the others
                 never joined, and the condition it sits under
    ERROR, OOM   the innermost frame of the user's code in the traceback
    CRASH        the innermost frame of the user's code in the faulthandler dump

``culprit_of(record)`` gives a ``Culprit`` or None (OK, slow by size, no evidence). The code
of the line comes from what the record stored (nsadiag.finding.source), and the trial's
files (its profile, its faulthandler dumps) are read only from inside the run directory
being rendered (nsadiag.runfiles).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nsadiag import runfiles
from nsadiag.evidence import StackFrame, StackSample
from nsadiag.finding import Culprit
from nsadiag.finding.numbers import count, sig, size
from nsadiag.finding.source import (
    APPEND,
    DUMP_NAME,
    HOST_READ,
    MAX_DUMP_BYTES,
    Sources,
    carried_sources,
)
from nsadiag.probes.frames import busy_threads, own_code, user_frame, wait_frame
from nsadiag.probes.profile_summary import ProfileSummary
from nsadiag.rundir import TrialRecord
from nsadiag.verdict.ranks import RankEvidence

FRAME_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<function>\S+)')
"""A frame of a Python traceback or a faulthandler dump."""
WHERE = re.compile(r"^(?P<file>.+):(?P<line>\d+) in (?P<function>\S+)$")
"""An ERROR verdict's ``where`` fact: "/path/model.py:21 in backward"."""


def culprit_of(record: TrialRecord) -> Culprit | None:
    """The line the record's evidence blames (see the module docstring), None when it
    names none."""
    name = record.verdict_name
    facts = record.facts
    evidence = record.evidence
    sources = carried_sources(evidence.source if evidence is not None else None)
    if name == "SLOW" and facts.slow.slow_by == "defect":
        return slow_culprit(record, sources)
    if name == "SLOW" and facts.slow.slow_cause:
        found = cause_culprit(record, sources)
        if found is not None:
            return found
    if name == "SLOW" and facts.slow.slow_by is None:  # work not counted: loops only
        return slow_culprit(record, sources, hot_lines=False)
    if name == "STALL-BUSY":
        return busy_culprit(_samples(record), sources, native=(
            evidence is not None and evidence.stall is not None and
            evidence.stall.stacks_class == "busy-native"))
    if name == "DEADLOCK":
        return wait_culprit(_samples(record), sources) or \
            chain_culprit(record, sources)
    if name == "STALL-COLLECTIVE":
        return collective_culprit(record, sources)
    if name == "OOM":
        return retain_culprit(record, sources) or error_culprit(record, sources)
    if name == "ERROR":
        return error_culprit(record, sources)
    if name == "CRASH":
        return crash_culprit(record, sources)
    return None


def _samples(record: TrialRecord) -> list[StackSample]:
    """The stack samples of the record's stall, none without one."""
    stall = record.evidence.stall if record.evidence is not None else None
    return stall.samples if stall is not None else []


def _profile(record: TrialRecord) -> ProfileSummary:
    """The rows of the record's profile summary (none when no profile was taken)."""
    evidence = record.evidence
    return ProfileSummary.from_dict(evidence.profile if evidence is not None else None)


def _culprit(sources: Sources, path: str, line: int, why: str,
             span: tuple[int, int] | None = None, code: str | None = None) -> Culprit:
    first, last = span or (line, line)
    return Culprit(sources.display_path(path), first, why, last if last > first else None,
                   sources.code_at(path, first) or (code if first == line else None))


# ---- SLOW: the loop that iterated ----------------------------------------------------------


def _split_where(where: str) -> tuple[str, str, int] | None:
    """("forward", "model.py", 42) of "forward (model.py:42)"."""
    match = re.match(r"^(?P<function>.+) \((?P<name>[^()]+):(?P<line>\d+)\)$", where)
    if not match:
        return None
    return match["function"], match["name"], int(match["line"])


def _full_path(record: TrialRecord, function: str, name: str) -> str | None:
    """The full path of the file called ``name`` that the profile saw ``function`` in:
    from the profile summary's lines, else the raw profile.json of the trial directory."""
    profile = _profile(record)
    for hot in profile.hot_lines:  # a hot line names no function apart from its ``where``
        if hot.file and Path(hot.file).name == name:
            return hot.file
    for frame in profile.frames:
        if frame.file and Path(frame.file).name == name and (
                frame.function in (None, function) or frame.where.startswith(function)):
            return frame.file
    raw = read_profile_json(record)
    for loop in (raw or {}).get("loops") or []:
        if Path(loop.get("file", "")).name == name and loop.get("function") == function:
            return loop["file"]
    return None


def _user_path(record: TrialRecord, function: str, name: str) -> str | None:
    """The full path of the user's file ``name``: from the profile (``_full_path``), else
    the script the command ran under that name (a frame of a process with no profile)."""
    return _full_path(record, function, name) or next(
        (arg for arg in record.spec.command or () if Path(arg).name == name), None)


MAX_PROFILE_BYTES = 64 * 2**20
"""A raw profile.json larger than this is not read (a long run's is a few MiB)."""


def profile_path(record: TrialRecord) -> Path | None:
    """The sampler's raw profile.json of the trial's training process: the trial
    directory's, the main process's of `nsadiag run`, else rank 0's; None when there is
    none, or the trial directory lies outside the run directory being rendered."""
    base = runfiles.trial_dir(record.trial_dir)
    if base is None:
        return None
    command = record.evidence.command if record.evidence is not None else None
    main = command.main_process if command is not None else None
    for candidate in (base / "profile.json", base / str(main or "-") / "profile.json",
                      base / "rank-0" / "profile.json"):
        if candidate.is_symlink() or candidate.is_file():
            return candidate
    return None


def read_profile_json(record: TrialRecord) -> dict[str, Any] | None:
    """The raw profile.json of ``profile_path``, when it may be read (nsadiag.runfiles:
    inside the run directory, a regular file, at most MAX_PROFILE_BYTES)."""
    import json

    path = profile_path(record)
    data = runfiles.read_bytes(path, MAX_PROFILE_BYTES, "profile.json") if path else None
    try:
        parsed = json.loads(data) if data else None
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _running(profile: ProfileSummary) -> set[tuple[str, str]]:
    """(function, file name) of the hot lines seen in forward or backward."""
    found = set()
    for line in profile.hot_lines:
        parsed = _split_where(line.where)
        if parsed and line.phase in ("forward", "backward"):
            found.add(parsed[:2])
    return found


def host_read_in(sources: Sources, path: str, span: tuple[int, int]) -> str | None:
    """"25 `token = targets[count].item()`": the first line of the loop body ``span``
    (its header excluded) that reads a tensor's value on the host; None without one."""
    for line in range(span[0] + 1, span[1] + 1):
        code = sources.code_at(path, line)
        if code and HOST_READ.search(code.split("#")[0]):
            return f"{line} `{code}`"
    return None


TRAINING_CALL = re.compile(r"\.backward\(|\b\w*opt\w*\.step\(|\bscaler\.step\(")
"""A call that makes the loop around it the training loop: a backward, an optimizer step."""


def training_loop(sources: Sources, path: str, span: tuple[int, int]) -> bool:
    """Whether the loop ``span`` of ``path`` is the training loop: its body calls backward
    or an optimizer step. Its iterations are the steps the run exists to take, and a value
    it reads on the host once per step (a loss printed) is normal: it is never the slow
    loop, however its counter moves."""
    for line in range(span[0] + 1, span[1] + 1):
        code = sources.code_at(path, line)
        if code and TRAINING_CALL.search(code.split("#")[0]):
            return True
    return False


def slow_culprit(record: TrialRecord, sources: Sources, hot_lines: bool = True
                 ) -> Culprit | None:
    """The loop of a SLOW by defect: the counter that advanced most in a function the
    forward or backward ran (stepping by one first), else (with ``hot_lines``) the loop
    around the hottest forward or backward line that sits in a loop."""
    profile = _profile(record)
    running = _running(profile)
    loops = [loop for loop in profile.loops
             if (_split_where(loop.where) or ("",))[:2] in running]
    loops.sort(key=lambda loop: (not loop.by_one, -loop.advanced))
    for loop in loops:
        function, name, line = _split_where(loop.where)
        path = _full_path(record, function, name)
        if path is None:
            continue
        rate = f" at {sig(loop.rate_per_s)}/s" if loop.rate_per_s else ""
        why = (f"the loop over `{loop.variable}` (counted {count(loop.advanced)} "
               f"iterations{rate} while sampled)")
        # the counter may be seen on a line past its loop (its variable outlives it):
        # the loop whose header the profile recorded then
        span = sources.loop_around(path, line, loop.variable) or (
            sources.loop_at(path, int(loop.for_line)) if loop.for_line else None)
        if span is not None and training_loop(sources, path, span):
            continue
        found = _culprit(sources, path, span[0] if span else line, why, span)
        read = host_read_in(sources, path, span) if span else None
        return replace(found, host_read=read) if read else found
    for hot in profile.hot_lines if hot_lines else ():
        if hot.phase not in ("forward", "backward") or not hot.file or hot.line is None:
            continue
        span = sources.loop_around(hot.file, int(hot.line))
        if span is not None and not training_loop(sources, hot.file, span):
            return _culprit(sources, hot.file, int(hot.line),
                            f"the loop around the hottest line of the {hot.phase} "
                            f"({hot.fraction:.0%} of the samples)", span, hot.code)
    return None


def cause_culprit(record: TrialRecord, sources: Sources) -> Culprit | None:
    """The user line a SLOW run's cause class names (nsadiag.verdict.slow_cause): the line
    its DataLoader workers were at (else where the main process asked for batches), the
    call that compiled again, the checkpointed call; None when it is not the user's."""
    cause = record.verdict.facts.slow.slow_cause
    if cause is None:
        return None
    share = f"{cause.share or 0:.0%}"
    candidates: list[tuple[str | None, str]] = []
    if cause.kind == "data-bound":
        workers = cause.workers or ()
        places = {w.where for w in workers if w.where}
        if len(places) == 1 and all(w.where for w in workers):
            many = (f"{len(workers)} DataLoader workers were" if len(workers) > 1 else
                    "DataLoader worker was")
            candidates.append((places.pop(), f"the line its {many} at when stopped, while "
                               f"the main process waited for batches in {share} of its "
                               f"samples"))
        candidates.append((cause.asked_at, f"where the main process asked for the "
                           f"next batch; it was in the DataLoader's `__next__` in {share} "
                           f"of its samples"))
    elif cause.kind == "recompiles":
        candidates.append((cause.called_at, f"the call of the compiled code that "
                           f"compiled again {cause.recompiles} times (the compiler "
                           f"held {share} of the samples)"))
    elif cause.kind == "outside-model":
        candidates.append((cause.loaded_at, f"the line that held {share} of the training "
                           f"samples outside the model's modules, backward and optimizer"))
    elif cause.kind == "checkpoint-recompute":
        candidates.append((cause.called_at, f"the checkpointed call whose forward the "
                           f"backward reran in {cause.backward_share or 0:.0%} of its "
                           f"samples"))
    for where, why in candidates:
        parsed = _split_where(where) if where else None
        path = _user_path(record, parsed[0], parsed[1]) if parsed else None
        if parsed and path:
            return _culprit(sources, path, parsed[2], why)
    return None


# ---- stalls: where the samples sat -----------------------------------------------------------


OUTER_FRAMES = 3
"""How many user frames out from the innermost a spin's loop header is looked for (the
condition of ``while not ready():`` calls ``ready``, where the samples sit)."""


def _spin_loop(frames: Sequence[StackFrame], sources: Sources
               ) -> tuple[StackFrame, tuple[int, int]] | None:
    """The loop a busy Python thread spins in, from its user frames (innermost first): the
    loop around the innermost frame's line, else the nearest outer frame whose line is a
    loop's header."""
    own = [f for f in frames if own_code(f)]
    if not own:
        return None
    span = sources.loop_around(own[0].file, own[0].line)
    if span is not None:
        return own[0], span
    for frame in own[1:1 + OUTER_FRAMES]:
        span = sources.loop_at(frame.file, frame.line)
        if span is not None:
            return frame, span
    return None


def busy_culprit(samples: Sequence[StackSample], sources: Sources, native: bool = False
                 ) -> Culprit | None:
    """The user line a busy process is stuck on: inside one native call (``native``), the
    user frame that made it; running Python, the loop it spins in, else the user frame
    the samples sat in most."""
    found = user_frame(samples)
    if found is None:
        return None
    frame, hits = found
    why = f"every busy sample sat here ({hits} of {len(samples)})" if hits >= len(samples) \
        else f"{hits} of {len(samples)} busy samples sat here"
    if not native:
        loops = [_spin_loop(thread.frames, sources) for sample in samples
                 for thread in busy_threads(sample)]
        loops = [loop for loop in loops if loop is not None]
        if loops and 2 * len(loops) >= len(samples):
            spin, span = loops[-1]
            return _culprit(sources, spin.file, span[0], f"the loop the busy samples spin in "
                            f"({len(loops)} of {len(samples)})", span)
    return _culprit(sources, frame.file, frame.line, why,
                    sources.loop_at(frame.file, frame.line), frame.code)


def _waiting_frame(samples: Sequence[StackSample]) -> StackFrame | None:
    """The user frame of the main (else first) thread that waits on a lock or condition in
    the last sample: the wait itself when it is the user's line, else the user line that
    called into it."""
    if not samples:
        return None
    threads = sorted(samples[-1].threads, key=lambda t: t.name != "MainThread")
    for thread in threads:
        waiting = wait_frame(thread)
        if waiting is None:
            continue
        if own_code(waiting):
            return waiting
        caller = next((f for f in thread.frames if own_code(f)), None)
        if caller is not None:
            return caller
    return None


def wait_culprit(samples: Sequence[StackSample], sources: Sources) -> Culprit | None:
    """The line a deadlocked thread blocks in."""
    frame = _waiting_frame(samples)
    if frame is None:
        return None
    return _culprit(sources, frame.file, frame.line, f"the thread waits here in all {len(samples)} "
                    f"samples, using no CPU", code=frame.code)


def chain_culprit(record: TrialRecord, sources: Sources) -> Culprit | None:
    """The user line the wait chain starts at (a wait the stacks do not show as one: a
    `flock` in the kernel), from the frame of the last sample standing at it."""
    chain = record.facts.stall.wait_chain
    first = chain.hops[0] if chain is not None and chain.hops else None
    samples = _samples(record)
    if first is None or not first.where or not samples:
        return None
    for thread in samples[-1].threads:
        for frame in thread.frames:
            if own_code(frame) and f"{Path(frame.file).name}:{frame.line}" == first.where:
                return _culprit(sources, frame.file, frame.line, "the thread waits here in "
                                "every sample: the first hop of the wait chain",
                                code=frame.code)
    return None


def collective_culprit(record: TrialRecord, sources: Sources) -> Culprit | None:
    """The user line of the odd rank's collective (the one the other ranks never joined),
    with the condition it is issued under."""
    facts = record.facts
    odd = set(facts.ranks.odd_ranks or [])
    stored = (record.evidence.ranks if record.evidence is not None else None) or []
    ranks = [RankEvidence.from_dict(rank) for rank in stored]
    for rank in sorted(ranks, key=lambda r: r.rank not in odd):
        samples = rank.stall.samples if rank.stall is not None else []
        found = user_frame(samples)
        if found is None:
            continue
        frame = found[0]
        waiting = next((row.waiting for row in facts.ranks.ranks or ()
                        if row.rank == rank.rank), None)
        n = facts.ranks.diverged_at
        if waiting is None:  # a rank that never issued the collective: it stands here
            why = f"rank {rank.rank} stands here" + (
                f" and never issued collective #{n}, which the other ranks wait in"
                if n and odd and rank.rank in odd else "")
            return _culprit(sources, frame.file, frame.line, why, code=frame.code)
        what = waiting.split(" (")[0]
        why = f"rank {rank.rank} issued {what} here"
        condition = sources.condition_above(frame.file, frame.line)
        if condition is not None:
            why += f", under `{condition[1]}` (line {condition[0]})"
        if odd and rank.rank in odd:
            why += "; the other ranks never issued it"
        return _culprit(sources, frame.file, frame.line, why, code=frame.code)
    return None


# ---- errors and crashes: the innermost user frame ---------------------------------------------


def innermost_user_frame(text: str) -> tuple[str, int, str] | None:
    """(file, line, function) of the innermost frame of the user's code in a traceback
    (most recent call last) or a faulthandler dump of the current thread (most recent
    first: pass it reversed)."""
    frames = [(m["file"], int(m["line"]), m["function"]) for m in FRAME_LINE.finditer(text)]
    own = [f for f in frames if own_code(StackFrame(f[2], f[0], f[1]))]
    return own[-1] if own else None


def error_culprit(record: TrialRecord, sources: Sources) -> Culprit | None:
    """The line that raised: the verdict's ``where`` when it is the user's, else the
    innermost user frame of the traceback."""
    facts = record.facts
    code = facts.crash.exit_code
    message = f"raised {facts.crash.exception_type}" if facts.crash.exception_type else \
        f"exits with code {code} (no exception)" if code else "raised an exception"
    match = WHERE.match(str(facts.crash.where or ""))
    if match and own_code(StackFrame(match["function"], match["file"], int(match["line"]))):
        return _culprit(sources, match["file"], int(match["line"]), message)
    result = record.evidence.result if record.evidence is not None else None
    exception = (result or {}).get("exception") or {}
    found = innermost_user_frame(str(exception.get("traceback") or ""))
    if found is None:
        return None
    return _culprit(sources, found[0], found[1], message)


KEPT_AS_VALUE = re.compile(r"\.item\(\)|\.detach\(\)|\.tolist\(\)|\bfloat\(|\bint\(")
"""What a loop appends when it keeps a value, not a tensor with its autograd history."""


def retain_culprit(record: TrialRecord, sources: Sources) -> Culprit | None:
    """For memory that grew per step: the line of the loop around the frame that keeps
    allocating (the profile's memory holder) that appends a tensor, not its value, to a
    container the loop does not create: what keeps every step's memory, rather than what
    allocates it. None when the growth, the holder or such a line is missing."""
    facts = record.facts
    growth = facts.memory.rss_growth_per_step or facts.memory.cuda_alloc_growth_per_step
    split = _split_where(str(facts.memory.rss_holder or facts.memory.cuda_holder or ""))
    if not growth or growth <= 0 or split is None:
        return None
    function, name, line = split
    path = _user_path(record, function, name)
    span = sources.loop_around(path, line) if path else None
    if path is None or span is None:
        return None
    found = _loop_append(sources, path, span, growth)
    return found if found is not None else _hook_append(sources, path, growth)


def holder_retain(record: TrialRecord, holder: str, growth: float) -> Culprit | None:
    """For a process whose memory grew ``growth`` bytes per step with its memory ``holder``
    ("fn (file:line)", one rank's): the loop's line that appends a tensor to a container
    kept across steps, as ``retain_culprit`` finds it; None when none is found."""
    split = _split_where(holder)
    if split is None or growth <= 0:
        return None
    function, name, line = split
    path = _user_path(record, function, name)
    sources = carried_sources(record.evidence.source if record.evidence is not None else None)
    span = sources.loop_around(path, line) if path else None
    if path is None or span is None:
        return None
    return _loop_append(sources, path, span, growth)


def _hook_append(sources: Sources, path: str, growth: float) -> Culprit | None:
    """The append of a hook function of the holder's file that keeps what it is given
    (nsadiag.sourcelines.hook_appends): it runs inside every forward, so the memory the
    step's line took is kept there, not in the loop's own lines."""
    source = sources.file(path)
    hooks = source.hooks if source is not None else []
    if len(hooks) != 1:  # one such append: the line; several would need the evidence to pick
        return None
    line, container, hook = hooks[0]
    found = _culprit(sources, path, line, f"the hook `{hook}` appends what each call is given "
                     f"to `{container}`, keeping every step's tensors and their graph: memory "
                     f"grew {size(growth)} per step")
    return replace(found, retains=container.split("[", 1)[0])


def _loop_append(sources: Sources, path: str, span: tuple[int, int], growth: float
                 ) -> Culprit | None:
    """The line of the loop ``span`` that appends a tensor, not its value, to a container
    the loop does not make anew; None when none does."""
    codes = {n: sources.code_at(path, n) or "" for n in range(span[0] + 1, span[1] + 1)}
    for number, code in codes.items():
        match = APPEND.match(code)
        if match is None or KEPT_AS_VALUE.search(match[2]):
            continue
        container = match[1]
        if any(re.match(rf"^\s*{re.escape(container)}\s*=", c) for c in codes.values()):
            continue  # made anew in every pass: it keeps nothing across steps
        found = _culprit(sources, path, number, f"appends to `{container}` in every pass of "
                         f"the loop at line {span[0]}, which keeps what each step's tensor "
                         f"holds: memory grew {size(growth)} per step")
        return replace(found, retains=container)
    return None


def crash_culprit(record: TrialRecord, sources: Sources) -> Culprit | None:
    """The innermost user frame of the crashing thread in a faulthandler dump of the trial
    (or of a rank's or process's directory)."""
    facts = record.facts
    signal = facts.crash.signal_name or "the signal"
    base = runfiles.trial_dir(record.trial_dir)
    for dump in runfiles.find(base, DUMP_NAME) if base is not None else []:
        data = runfiles.read_bytes(dump, MAX_DUMP_BYTES, DUMP_NAME)
        if data is None:
            continue
        text = data.decode(errors="replace")
        current = text.split("Current thread", 1)[-1].split("\n\n", 1)[0]
        lines = current.splitlines()
        found = innermost_user_frame("\n".join(reversed(lines)))
        if found is not None:
            return _culprit(sources, found[0], found[1], f"the last line of the user's code before "
                            f"{signal}")
    # a native thread took the signal: the dump has no current thread, and the crash
    # record names the main thread's frame (nsadiag.harness.crash)
    crash = facts.crash.crash
    split = _split_where(crash.where or "") if crash is not None else None
    if split is None:
        return None
    function, name, line = split
    path = _user_path(record, function, name) or name
    inside = f", in {crash.call}" if crash is not None and crash.call else ""
    return _culprit(sources, path, line, f"the main thread's last line of the user's code "
                    f"before {signal}{inside}")
