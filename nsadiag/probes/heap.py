"""Bytes of the C heap in use in this process, from glibc's ``mallinfo2()``.

Resident memory (RSS) rises where the heap needs fresh pages, not where the memory that
stays is allocated: once a loop keeps each step's tensors, the freed memory of a backward
or an optimizer step lands between them and the next temporaries need new pages, so RSS
rises under those lines, more so on a loaded machine where more samples fall inside them
(a retained validation graph was blamed on `optimizer.step()` that way). What malloc has
handed out and not had back moves only when memory is allocated or freed: the rise of a
kept tensor is seen by the call that allocated it. PyTorch's CPU tensors are malloc'd
(small ones in the arenas, ``uordblks``; large ones mapped, ``hblkhd``), so this counts
them. ``mallinfo2`` is glibc 2.33 or later; elsewhere ``heap_bytes`` is None and the
ledger keeps to RSS.
"""

from __future__ import annotations

import ctypes

_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
           "uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _mallinfo2() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        # a PyDLL call keeps the GIL: the model's thread is not handed it for a call
        # that takes microseconds (nsadiag.probes.framemem.read_at)
        function = ctypes.PyDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    function.restype = _MallInfo2
    function.argtypes = ()
    return function


_MALLINFO2 = _mallinfo2()


def heap_bytes() -> int | None:
    """Bytes malloc has handed out and not had back (arenas and mapped chunks); None where
    the C library has no ``mallinfo2``."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)
