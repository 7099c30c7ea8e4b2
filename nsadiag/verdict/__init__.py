"""Evidence -> verdict: the rules, progress, known exception causes and cross-rank decisions.

``decide(evidence)`` names a trial's verdict (``rules``); ``explain_exception`` gives the
cause and fixes of a known error message (``known``); ``progress`` measures rate and ETA;
``ranks`` decides a multi-rank job.
"""

from nsadiag.verdict.known import explain_exception
from nsadiag.verdict.rules import FAILURES, NAMES, Verdict, decide

__all__ = ["FAILURES", "NAMES", "Verdict", "decide", "explain_exception"]
