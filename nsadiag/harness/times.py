"""The times one watch runs under, declared together and checked against each other.

``WatchTimes(stall_timeout_s, budget_s, startup_grace_s, pg_timeout_s, poll_s)``:

stall_timeout_s   no progress for this long is a stall (nsadiag.harness.streams);
budget_s          the wall time a job may take while it progresses (inf: none);
startup_grace_s   until the first forward the stall limit is at least this;
pg_timeout_s      a multi-rank job's process-group timeout (None: derived, see below);
poll_s            how often the watch session reads its streams;
capture_window_s  derived: how long a stall's evidence is sampled for.

The derived times and the checks say how they depend on each other. At a stall, every
rank's stacks are sampled over the capture window while the ranks still wait in their
collective, so the process-group timeout must outlast the stall timeout, the capture
window and the time each sample may take: otherwise the collective raises first and the
stacks show an exception handler instead of the wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nsadiag.spec import STARTUP_GRACE_S, WATCH_POLL_S

CAPTURE_WINDOW_MIN_S = 1.5
"""Three stack samples half a second apart: the fewest that tell frozen stacks from moving
ones."""
CAPTURE_WINDOW_MAX_S = 6.0
"""A longer window adds little (a frozen stack stays frozen) and delays the verdict."""
SAMPLE_TIMEOUT_S = 8.0
"""Each py-spy sample of a stalled process is given this long (a loaded machine)."""
CAPTURE_FINISH_S = 2.0
"""After a stalled process's last stack sample its capture reads its CPU clocks, takes its
faulthandler dump and reads what it waits on (/proc): tenths of a second on a loaded
2-core machine. A process's capture still running this long after the capture window's
end is cut off (nsadiag.harness.capture.capture_all), so one wedged probe cannot hold the
verdict."""
PG_TIMEOUT_MARGIN_S = 60.0
"""The derived process-group timeout's margin beyond twice the stall timeout: a minute, so
a collective that never completes still ends in minutes, not torch's default 30."""


def pg_timeout_for(stall_timeout_s: float) -> float:
    """The process-group timeout of a job watched with ``stall_timeout_s``: twice the stall
    timeout (the clock's silence limit, then the stack sampling) plus a minute."""
    return 2.0 * stall_timeout_s + PG_TIMEOUT_MARGIN_S


def capture_window_for(stall_timeout_s: float) -> float:
    """Half the stall timeout, within [CAPTURE_WINDOW_MIN_S, CAPTURE_WINDOW_MAX_S]."""
    return min(max(CAPTURE_WINDOW_MIN_S, stall_timeout_s / 2), CAPTURE_WINDOW_MAX_S)


@dataclass(frozen=True)
class WatchTimes:
    """See the module docstring. ValueError (one line, naming the time) when a time is not
    a positive number, or the stall timeout is not longer than the poll interval."""

    stall_timeout_s: float
    budget_s: float = math.inf
    startup_grace_s: float = STARTUP_GRACE_S
    pg_timeout_s: float | None = None
    poll_s: float = WATCH_POLL_S
    capture_window_s: float = field(init=False)

    def __post_init__(self) -> None:
        for name in ("stall_timeout_s", "budget_s", "poll_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{name}: must be a positive number of seconds, got "
                                 f"{value!r}")
        if not (isinstance(self.startup_grace_s, (int, float)) and
                math.isfinite(self.startup_grace_s) and self.startup_grace_s >= 0):
            raise ValueError(f"startup_grace_s: must be >= 0 seconds, got "
                             f"{self.startup_grace_s!r}")
        if self.pg_timeout_s is None:
            object.__setattr__(self, "pg_timeout_s", pg_timeout_for(self.stall_timeout_s))
        object.__setattr__(self, "capture_window_s", capture_window_for(self.stall_timeout_s))
        if self.poll_s >= self.stall_timeout_s:
            raise ValueError(f"stall_timeout_s: {self.stall_timeout_s:g} s is not longer "
                             f"than the poll interval ({self.poll_s:g} s): a stall would be "
                             f"seen a whole poll late")

    @property
    def evidence_by_s(self) -> float:
        """When, after the last progress, a stall's evidence is taken at the latest: the
        stall timeout, then the capture window or a first sample's time limit if longer
        (nsadiag.harness.capture), then what is read after the samples."""
        return self.stall_timeout_s + max(self.capture_window_s, SAMPLE_TIMEOUT_S) + \
            CAPTURE_FINISH_S

    def collective_outlasts_capture(self) -> bool:
        """Whether a collective that never completes still waits while the stall's
        evidence is taken (see the module docstring). Always so for the derived timeout;
        a shorter one given on purpose (to see what the collective raises) is kept, and
        the job's evidence says it ends the wait first."""
        return self.pg_timeout_s > self.evidence_by_s
