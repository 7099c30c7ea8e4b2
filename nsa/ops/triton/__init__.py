"""NSA attention ops as Triton kernels (selected: group-centric; compressed and window: a
flash kernel over a key band), with the same layouts, semantics and (o, lse) contracts as
`nsa.ops.torch`; forward and backward are deterministic (no atomics).

This package only states the shape limits; `nsa.ops.triton.ops` holds the kernels and is
imported when a triton path first runs.
"""

from nsa.ops.triton._common import unsupported_reason

__all__ = ["unsupported_reason"]
