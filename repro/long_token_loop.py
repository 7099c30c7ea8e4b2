"""Defect: the per-token attention loop of repro.per_token_loop at a length where one
block's forward and its backward each run for several seconds without a module event.

Expected verdict: SLOW. No heartbeat arrives for longer than the stall timeout, but the
sampler sees the token loop's counter advance in forward and autograd nodes run in
backward: progress, so the budget ends the run as SLOW, with the loop named.
"""

from __future__ import annotations

from repro.per_token_loop import make

__all__ = ["make"]
