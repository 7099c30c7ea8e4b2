"""Evidence -> verdict: the rules, progress, known exception causes and cross-rank decisions.

``decide(evidence)`` names a trial's verdict (``rules``); ``explain_exception`` gives the
cause and fixes of a known error message (``known``); ``progress`` measures rate and ETA;
``ranks`` decides a multi-rank job; ``load`` reads a job's load figures; ``is_failure``
says whether a verdict is a failure found (a SLOW by size is not).
"""

from nsadiag.verdict.known import explain_exception
from nsadiag.verdict.rules import FAILURES, NAMES, Verdict, decide, is_failure

__all__ = ["FAILURES", "NAMES", "Verdict", "decide", "explain_exception", "is_failure"]
