"""Integer locals and ``range`` loop bounds of another thread's frame, read without touching
the frame: the bytes come from ``/proc/self/mem``.

Why not ``frame.f_locals``: on CPython < 3.13 reading it runs FastToLocals, which writes the
frame's locals dict (dropping the values it held there, which can run a tensor's
deallocation on the reading thread), and keeps every local alive in that dict until the
next read. Done from a sampler thread while the main thread was inside a
``__torch_dispatch__`` under dynamo-disabled wrappers, it crashed the watched process
(SIGSEGV in ``f_locals``). On 3.13+ ``f_locals`` is PEP 667's proxy, whose reads do not
write, but every read still hands the reading thread a strong reference to the value (a
tensor freed on our thread when the program drops it meanwhile), and a free-threaded build
has no lock that makes the read atomic; one reader for every version is simpler to trust.

How: a frame object holds a pointer to its interpreter frame, whose ``localsplus`` array
holds the fast locals, then the cells and free variables, then the value stack. The offsets
are not hard-coded: ``Layout.calibrate`` finds them in a frame of the calling thread whose
locals it knows, and refuses (``None``: no locals are read) when anything does not match.
Each read is a ``pread`` of this process's memory, made with the GIL held (``read_at``): a
pointer that went stale between two reads (the frame returned, its memory was reused)
yields wrong bytes or an error, never a fault, and no Python object is created from a
pointer, so no reference count moves and no object's lifetime changes. An ``int`` is
decoded from its digits; an object is taken as one only when its type pointer is ``int``'s
(``bool`` is not). The program runs on between two reads (the GIL may pass to it), so an
int can be freed and its memory reused by another int between reading the slot and reading
the int: the slots are read again after their ints, and a value is kept only when its slot
still points at the same object (a loop's counter read without this check once summed
1.25e9 iterations of an 8,192 loop).

``range`` loops: a running ``for x in range(...)`` keeps its iterator on the value stack.
The iterator (3.11: start, step, length and an index; 3.12+: the next value, step and the
values left) gives where the loop ends, whatever expression built the range (a tensor's
``shape[1]`` included). An iterator is taken for a variable only when the value it yielded
last is the variable's value now.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from dataclasses import dataclass
from types import CodeType, FrameType

WORD = struct.calcsize("P")
CO_OPTIMIZED = 0x1
"""A code flag: the function keeps its variables in fast locals (a module's code does not)."""
MAX_SCAN_WORDS = 24
"""Words of an interpreter frame searched for its code pointer and its locals."""
MAX_INT_DIGITS = 4
"""Digits of an int decoded (30 bits each: up to 2**120); longer ints are skipped."""
_INT_TYPE, _CELL_TYPE = id(int), id(type((lambda v: lambda: v)(0).__closure__[0]))
_RANGE_ITER_TYPE = id(type(iter(range(1))))
_FRAME_DATA_OFFSET = 3 * WORD  # PyObject_HEAD, f_back, then f_frame (3.11 - 3.13)


@dataclass(frozen=True)
class Layout:
    """Where things lie in this interpreter's frames, found by ``calibrate``."""

    code: int  # byte offset of the code object pointer in an interpreter frame
    locals: int  # byte offset of localsplus in an interpreter frame
    mem: int  # an open descriptor of /proc/self/mem

    @classmethod
    def calibrate(cls) -> Layout | None:
        """The layout of this interpreter, or None when it cannot be confirmed (then
        nsadiag reads no locals at all)."""
        if sys.implementation.name != "cpython" or sys.version_info < (3, 11) or \
                not hasattr(sys, "_current_frames"):
            return None
        try:
            mem = os.open("/proc/self/mem", os.O_RDONLY)
        except OSError:
            return None
        found = _find_offsets(mem)
        if found is None:
            os.close(mem)
            return None
        return cls(found[0], found[1], mem)

    def close(self) -> None:
        os.close(self.mem)


def _probe(first: object, second: object) -> tuple[FrameType, int, int]:
    third = 1234567  # an int local, decoded back below to confirm the int layout
    return sys._getframe(), third, -third


def _find_offsets(mem: int) -> tuple[int, int] | None:
    first, second = object(), object()
    frame, third, negative = _probe(first, second)
    # the frame returned: its data now lives in the frame object, read the same way
    base = _word(mem, id(frame) + _FRAME_DATA_OFFSET)
    words = _words(mem, base, MAX_SCAN_WORDS) if base else None
    if not words:
        return None
    code_at = [i for i, w in enumerate(words) if w == id(frame.f_code)]
    locals_at = [i for i in range(len(words) - 2)
                 if words[i] == id(first) and words[i + 1] == id(second)]
    if len(code_at) != 1 or len(locals_at) != 1:
        return None
    layout = (code_at[0] * WORD, locals_at[0] * WORD)
    slots = _words(mem, base + layout[1], 3)
    if slots is None or _read_int(mem, slots[2]) != third or \
            _read_int(mem, id(negative)) != negative or _read_int(mem, id(0)) != 0:
        return None
    return layout


_LIBC = ctypes.PyDLL(None, use_errno=True)  # a PyDLL call keeps the GIL: see read_at
_PREAD = _LIBC.pread
_PREAD.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
_PREAD.restype = ctypes.c_ssize_t
_WRITE = _LIBC.write
_WRITE.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
_WRITE.restype = ctypes.c_ssize_t


def read_at(fd: int, size: int, offset: int, partial: bool = False) -> bytes | None:
    """``pread`` of ``size`` bytes at ``offset`` without letting the GIL go (None when
    fewer came, unless ``partial``: then what came, a /proc file's text).

    ``os.pread`` releases the GIL around the call: from the sampler's thread every such
    read hands the GIL to the main thread and takes it back, and on a loaded machine the
    main thread then waits, GIL-less, for the sampler's thread to get a core again (a
    dozen reads a sample made a model of small blocks several times slower under load).
    A read of memory or of a /proc file returns at once."""
    buffer = ctypes.create_string_buffer(size)
    try:
        done = _PREAD(fd, buffer, size, offset)
    except ctypes.ArgumentError:
        return None
    if partial:
        return buffer.raw[:done] if done >= 0 else None
    return buffer.raw[:size] if done == size else None


def write_all(fd: int, data: bytes) -> None:
    """``write`` all of ``data`` to ``fd`` without letting the GIL go (see ``read_at``);
    OSError when the system refuses it (a full disk).

    For a heartbeat's own regular file, whose writes land in the page cache at once: a
    write through ``os.write`` or a file object lets the GIL go, and when the sampler's
    thread waits for the GIL just then, the writing thread waits in turn for it to come
    back, one more hand-off each time (bench/bench_gil_handoffs.py)."""
    while data:
        done = _WRITE(fd, data, len(data))
        if done <= 0:
            code = ctypes.get_errno() if done < 0 else errno.EIO  # 0: nothing more goes
            if code == errno.EINTR:
                continue
            raise OSError(code, os.strerror(code))
        data = data[done:]


def _read(mem: int, address: int, size: int) -> bytes | None:
    return read_at(mem, size, address)


def _words(mem: int, address: int, count: int) -> tuple[int, ...] | None:
    data = _read(mem, address, count * WORD)
    return struct.unpack(f"{count}P", data) if data is not None else None


def _word(mem: int, address: int) -> int | None:
    found = _words(mem, address, 1)
    return found[0] if found else None


def _read_int(mem: int, address: int) -> int | None:
    """The value of the int at ``address``; None when the object there is not an int."""
    head = _words(mem, address, 3)
    if head is None or head[1] != _INT_TYPE:
        return None
    if sys.version_info >= (3, 12):  # lv_tag: digit count << 3 | sign (0 +, 1 zero, 2 -)
        tag = head[2]
        count, sign = tag >> 3, tag & 3
        if sign == 1:
            return 0
        negative = sign == 2
    else:  # ob_size: the digit count, negative for a negative int
        size = struct.unpack("q", struct.pack("Q", head[2]))[0]
        count, negative = abs(size), size < 0
        if count == 0:
            return 0
    if not 0 < count <= MAX_INT_DIGITS:
        return None
    data = _read(mem, address + 3 * WORD, 4 * count)
    if data is None:
        return None
    value = 0
    for digit in reversed(struct.unpack(f"{count}I", data)):
        value = (value << 30) | digit
    return -value if negative else value


def _slot_int(mem: int, pointer: int) -> int | None:
    """An int held in a slot directly or through a cell (a loop variable a closure reads).
    A cell's content is read again after its int: a different pointer then means the int
    may have been freed while it was read, and the reading is dropped."""
    if not pointer:
        return None
    kind = _word(mem, pointer + WORD)
    if kind == _CELL_TYPE:
        content = _word(mem, pointer + 2 * WORD) or 0
        value = _read_int(mem, content) if content else None
        return value if _word(mem, pointer + 2 * WORD) == content else None
    return _read_int(mem, pointer) if kind == _INT_TYPE else None


def local_names(code: CodeType) -> tuple[str, ...]:
    """The names of ``localsplus`` in order: locals, the cells that are not arguments, the
    free variables (an argument a closure reads is a cell in its argument's slot)."""
    own = code.co_varnames
    cells = tuple(name for name in code.co_cellvars if name not in own)
    return own + cells + code.co_freevars


class FrameReader:
    """Reads frames of other threads through ``layout`` (see the module docstring)."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def _base(self, frame: FrameType) -> int | None:
        """The interpreter frame of ``frame``, when it still holds ``frame``'s code."""
        mem, layout = self.layout.mem, self.layout
        base = _word(mem, id(frame) + _FRAME_DATA_OFFSET)
        if not base or _word(mem, base + layout.code) != id(frame.f_code):
            return None
        return base

    def int_locals(self, frame: FrameType, limit: int) -> dict[str, int]:
        """Up to ``limit`` int locals of ``frame``, by name, in ``localsplus`` order."""
        base = self._base(frame)
        if base is None:
            return {}
        names = local_names(frame.f_code)
        slots = _words(self.layout.mem, base + self.layout.locals, len(names))
        found: dict[str, int] = {}
        if slots is None:
            return found
        for name, pointer in zip(names, slots, strict=True):
            value = _slot_int(self.layout.mem, pointer)
            if value is not None:
                found[name] = value
                if len(found) >= limit:
                    break
        # the program runs while this thread reads (each read lets the GIL go): a slot that
        # points elsewhere now may have let its int be freed and reused meanwhile, so only
        # the values of slots that held the same object before and after are kept
        again = _words(self.layout.mem, base + self.layout.locals, len(names))
        if again is None:
            return {}
        same = {name for name, before, after in zip(names, slots, again, strict=True)
                if before == after}
        return {name: value for name, value in found.items() if name in same}

    def int_names(self, frame: FrameType, limit: int) -> dict[str, int]:
        """Up to ``limit`` int variables of ``frame`` by name: its fast locals
        (``int_locals``), or, for a module's top-level code (a script's own loop), the
        module's globals its code names. A module frame keeps its variables in the
        globals dict itself, and ``f_globals`` hands that dict over without touching the
        frame (no FastToLocals); only ints are taken from it, which keep nothing alive."""
        code = frame.f_code
        if code.co_flags & CO_OPTIMIZED or code.co_name != "<module>":
            return self.int_locals(frame, limit)
        names = frame.f_globals
        found: dict[str, int] = {}
        for name in code.co_names:
            value = names.get(name)
            if type(value) is int:
                found[name] = value
                if len(found) >= limit:
                    break
        return found

    def range_end(self, frame: FrameType, value: int) -> int | None:
        """Where the ``range`` loop that last yielded ``value`` ends (exclusive), from the
        iterators on ``frame``'s value stack; None when none of them yielded it last."""
        base = self._base(frame)
        if base is None:
            return None
        code = frame.f_code
        start = base + self.layout.locals + len(local_names(code)) * WORD
        stack = _words(self.layout.mem, start, min(code.co_stacksize, MAX_SCAN_WORDS))
        for index, pointer in enumerate(stack or ()):
            if pointer and _word(self.layout.mem, pointer + WORD) == _RANGE_ITER_TYPE:
                end = self._iterator_end(pointer, value)
                # still on the stack after the read: the iterator was alive while read
                if end is not None and _word(self.layout.mem, start + index * WORD) == pointer:
                    return end
        return None

    def _iterator_end(self, pointer: int, value: int) -> int | None:
        fields = _read(self.layout.mem, pointer + 2 * WORD, 4 * WORD)
        if fields is None:
            return None
        if sys.version_info >= (3, 12):  # start (the next value), step, values left
            start, step, left = struct.unpack("3q", fields[:3 * WORD])
            last, end = start - step, start + step * left
            yielded = step != 0 and left >= 0
        else:  # index (values yielded), start, step, length
            index, start, step, length = struct.unpack("4q", fields)
            last, end = start + (index - 1) * step, start + step * length
            yielded = step != 0 and 0 < index <= length
        return end if yielded and last == value else None

    def close(self) -> None:
        self.layout.close()


def reader() -> FrameReader | None:
    """A reader for this interpreter, or None where the layout cannot be confirmed."""
    layout = Layout.calibrate()
    return FrameReader(layout) if layout is not None else None
