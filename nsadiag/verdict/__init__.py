"""Every verdict decision: evidence -> verdict, with the facts and reasons that decided it.

``decide(evidence)`` names a watched run's verdict (``rules``: the rule chain; ``stall``:
what a stalled process was doing; ``slow``: a SLOW's rate, ETA and cause); ``window`` judges
a live process over an attach window; ``ranks`` decides a multi-rank job; ``progress`` is the
one definition of progress, with rate and ETA; ``size_or_defect`` says why a run is slow;
``load`` reads a job's load figures; ``triage`` says what a check that ran out of time
stands for and a triage's verdict when nothing failed; ``explain_exception`` gives the cause
of a known error message and names the error (``known``; its fixes are in
nsadiag.finding.known_fixes); ``thresholds`` holds every figure these
compare against;
``VerdictName`` is every verdict's name; ``is_failure`` says whether a verdict is a failure
found (a SLOW by size is not), ``VerdictName.is_timing`` whether a loaded machine can produce
it on a healthy run (``TIMING``).
"""

from nsadiag.verdict.known import explain_exception
from nsadiag.verdict.names import FAILURES, NAMES, TIMING, Verdict, VerdictName, is_failure
from nsadiag.verdict.rules import decide

__all__ = ["FAILURES", "NAMES", "TIMING", "Verdict", "VerdictName", "decide",
           "explain_exception", "is_failure"]
