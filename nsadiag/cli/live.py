"""The live status line of `nsadiag run` on a terminal: what is watched, how far and how
fast it goes, the loop it is in, and how long until a silence would be called a stall.

``RunStatus`` is fed every poll's heartbeat events (nsadiag.harness.session's
``on_events``) and asked for its line by the echo's thread (nsadiag.harness.echo), which
draws it below the command's output at most twice a second. Every part of the line is
read from the events or from the processes' sampled profiles (``profile.json``,
nsadiag.probes.profile) and left out while it has not been measured:

    nsadiag: 1 process, 0:42 | progressing | step 14, 1.3 s/step | 512/4096, 31/s, pass
    ETA 1:55: loop `t` in attend (model.py:88)

In a job of several hosts, once the hosts' shared step times name a straggler
(nsadiag.hosts.shared), the line names it after the steps: ``straggler: rank 3 on host2,
2.9x`` (its own time per step against the others' median), until it is no longer named.

At ``--deadline`` the line says the watch is checking (it samples the stacks, then stops
the run: SLOW while it progressed); in the deadline's last ten minutes it shows the time
left. The stall part repeats the watch's own rule (nsadiag.harness.streams): the stall check
comes after ``stall_timeout_s`` without progress once a forward pass was seen, after the
start-up grace before that, counted from the parent's reading of the events as the watch
counts it; past it the line says the watch is checking (on a loaded machine the watch
does not count the time the program waited for a CPU, so its decision can come later).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nsadiag.fmt import clock
from nsadiag.probes.profile import read_profile, summarize
from nsadiag.probes.waits import PersonWait
from nsadiag.spec import STARTUP_GRACE_S
from nsadiag.verdict.progress import is_progress

if TYPE_CHECKING:
    from nsadiag.cli.render import Terminal

RATE_STEPS = 20
"""The step rate is read over the last this many steps."""
PROFILE_READ_S = 2.0
"""The sampled profiles are read again at most this often (the sampler writes them every
2 s)."""
PROFILES_READ = 4
"""The most recently written profiles read at each refresh: the training process is among
them; a job with dozens of data workers is not read whole twice a second."""
DEADLINE_SHOWN_S = 600.0
"""The time left to --deadline is shown in its last ten minutes."""
QUIET_SHOWN_S = 2.0
"""A silence shorter than this is shown as progressing (pulses come every second)."""


def straggler_text(found: dict[str, Any]) -> str:
    """"straggler: rank 3 on host2, 2.9x" for a straggler (Straggler.to_dict): its global
    rank, its host where known, its own time per step against the others' median."""
    host = f" on {found['host']}" if found.get("host") else ""
    ratio = found.get("ratio")
    times = f", {ratio:.1f}x" if isinstance(ratio, (int, float)) else ""
    return f"straggler: rank {found['rank']}{host}{times}"


def pace(per_s: float, unit: str) -> str:
    """``3.2 steps/s`` or, below one a second, ``1.3 s/step``."""
    return f"{per_s:.1f} {unit}s/s" if per_s >= 1 else f"{1 / per_s:.1f} s/{unit}"


class RunStatus:
    """See the module docstring. ``redact`` is applied to the line (it names files and
    functions of the user's code)."""

    def __init__(self, run_dir: Path, stall_timeout_s: float, startup_grace_s: float,
                 deadline_s: float = math.inf, redact: Callable[[str], str] = str,
                 now: Callable[[], float] = time.monotonic,
                 awaits_person: Callable[[int], bool] | None = None):
        self.run_dir, self.redact, self.now = run_dir, redact, now
        # as the stall clock asks it: a prompt in the main thread, or in a thread it joins
        self.awaits_person = awaits_person or PersonWait()
        self.stall_timeout_s, self.startup_grace_s = stall_timeout_s, startup_grace_s
        self.deadline_s = deadline_s
        self.started = self.last_progress = now()
        self._lock = threading.Lock()
        self.processes: set[int] = set()
        self.step_times: deque[float] = deque(maxlen=RATE_STEPS)
        self.steps = 0
        self.last_step_at = self.started
        self.training = False
        self.frame: str | None = None
        self.loop: dict[str, Any] | None = None
        self._loop_read_at: float | None = None
        self.straggler: dict[str, Any] | None = None

    def on_events(self, events: list[dict[str, Any]]) -> None:
        """Take one poll's events (the watch's thread)."""
        with self._lock:
            for event in events:
                kind = event.get("kind")
                if is_progress(event):
                    self.last_progress = self.now()
                if kind == "start" and event.get("pid"):
                    self.processes.add(int(event["pid"]))
                if event.get("phase") == "forward":
                    self.training = True
                if kind == "step" and isinstance(event.get("t"), (int, float)) and \
                        int(event.get("step", 0)) + 1 > self.steps:
                    # a step counts once, when the first process (of several ranks) ends it
                    self.steps = int(event.get("step", 0)) + 1
                    self.step_times.append(float(event["t"]))
                    self.last_step_at = self.now()
                if kind == "pulse" and event.get("frame"):
                    self.frame = str(event["frame"])

    def on_straggler(self, found: dict[str, Any] | None) -> None:
        """Take the straggler named at a read of the hosts' states, None when none is (the
        watch's thread)."""
        with self._lock:
            self.straggler = found

    def line(self) -> str | None:
        """The status line now (the echo's thread)."""
        now = self.now()
        self._read_loop(now)
        with self._lock:
            # the stall part second: a narrow terminal cuts the line's end
            straggler = straggler_text(self.straggler) if self.straggler else None
            quiet = now - self.last_progress >= QUIET_SHOWN_S
            parts = [self._watching(now), self._stall(now), self._steps(now), straggler,
                     self._where(quiet)]
        return self.redact(" | ".join(part for part in parts if part))

    # ---- the parts -------------------------------------------------------------------

    def _watching(self, now: float) -> str:
        count = len(self.processes)
        what = f"{count} process{'es' if count != 1 else ''}" if count else "starting"
        return f"nsadiag: {what}, {clock(now - self.started)}"

    def _steps(self, now: float) -> str | None:
        """Steps done and their pace over the last RATE_STEPS steps; once no step came for
        three of their intervals (and QUIET_SHOWN_S), how long ago the last one came."""
        if not self.steps:
            return None
        times, since = self.step_times, now - self.last_step_at
        interval = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        if since >= QUIET_SHOWN_S and (interval is None or since > 3 * interval):
            return f"step {self.steps}, the last {since:.0f} s ago"
        if not interval:
            return f"step {self.steps}"
        return f"step {self.steps}, {pace(1 / interval, 'step')}"

    def _where(self, quiet: bool = False) -> str | None:
        """The loop the profiles show, its numbers first (a narrow terminal cuts the end of
        the line, and the place is the part that can go); while nothing progresses its last
        position only: a rate and an ETA read before the silence would be stale."""
        loop = self.loop
        if loop is None:
            return f"in {self.frame}" if self.frame else None
        done = f"{loop['last']}/{loop['end']}" if isinstance(loop.get("end"), int) \
            else f"{loop['variable']}={loop['last']}"
        numbers = [done]
        rate = loop.get("pass_rate_per_s") or loop.get("rate_per_s")
        if rate and not quiet:
            numbers.append(f"{rate:.0f}/s" if rate >= 10 else f"{rate:.1f}/s")
        if loop.get("eta_s") is not None and not quiet:
            numbers.append(f"pass ETA {clock(loop['eta_s'])}")
        where = f"loop `{loop['variable']}` in {loop['where']}"
        if quiet:
            return f"{done} when it went quiet: {where}"
        return f"{', '.join(numbers)}: {where}"

    def _stall(self, now: float) -> str:
        left = self.deadline_s - (now - self.started)
        if left <= 0:  # the watch samples the stacks now, then stops the run: SLOW or stuck
            return "at the deadline: checking"
        deadline = f", deadline in {clock(left)}" if left <= DEADLINE_SHOWN_S else ""
        return self._silence(now) + deadline

    def _silence(self, now: float) -> str:
        quiet = now - self.last_progress
        if quiet >= QUIET_SHOWN_S and any(self.awaits_person(pid) for pid in self.processes):
            # the watch holds its stall clock for a prompt (nsadiag.harness.streams)
            return "waiting for an answer typed at the terminal, no stall check meanwhile"
        limit = self.stall_timeout_s if self.training else \
            max(self.stall_timeout_s, self.startup_grace_s)
        if quiet < QUIET_SHOWN_S:
            return "progressing"
        if quiet < limit:
            return f"no progress for {quiet:.0f} s, stall check in {limit - quiet:.0f} s"
        # the watch waits longer on a loaded machine (time spent waiting for a CPU is not
        # counted), then samples the stacks: the decision comes after the timeout
        return f"no progress for {quiet:.0f} s, past the {limit:.0f} s stall timeout: checking"

    def _read_loop(self, now: float) -> None:
        """The loop of the processes' profiles to show, read every PROFILE_READ_S."""
        if self._loop_read_at is not None and now - self._loop_read_at < PROFILE_READ_S:
            return
        self._loop_read_at = now
        paths = sorted(self.run_dir.glob("proc-*/profile.json"),
                       key=_modified, reverse=True)[:PROFILES_READ]
        loops = []
        for path in paths:
            profile = read_profile(path)
            if profile is not None:
                loops += summarize(profile).get("loops") or []
        # a loop that counts its iterations to a known end first (it has an ETA), then one
        # that counts by one (a running sum is not a loop's progress), then the busiest
        best = max(loops, key=lambda loop: (isinstance(loop.get("end"), int),
                                            bool(loop.get("by_one")), loop["advanced"]),
                   default=None)
        with self._lock:
            self.loop = best


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def live_status(term: Terminal, run_dir: Path, stall_timeout_s: float, deadline_s: float
                ) -> RunStatus | None:
    """The status line for a run shown on a terminal; None when stderr is a pipe, a file
    or a CI log (a line redrawn twice a second would be noise there)."""
    if not term.live:
        return None
    return RunStatus(run_dir, stall_timeout_s, STARTUP_GRACE_S, deadline_s, term.redacted)
