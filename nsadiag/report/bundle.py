"""A redacted archive of a run directory, for sharing: `nsadiag report DIR --bundle`.

The run directory itself keeps raw data (trial heartbeats, stacks, the command's output);
the bundle holds a redacted copy of the text files nsadiag wrote there (JSON structurally,
JSON Lines line by line, the rest as text; see nsadiag.redact) and its plots, after
re-rendering report.md and summary.json redacted, all under the directory's lock. The
hosts the job's ranks are named by (which the report on the job's machines shows) appear
under pseudonyms, host-1, host-2, ..., the same for the same host in every file, so the
verdict still reads.

A run directory may come from someone else, so nothing in it is taken on trust. A file
goes into the bundle only when nsadiag's own manifest names it (nsadiag.rundir's
``written_by_nsadiag``), it is a regular file with one link (a hard link may be a file
outside), it is reached without following a symbolic link and resolves inside the
directory; a plot must be a well-formed PNG, and only its image chunks are copied (text
chunks and anything after its end are dropped), so a key renamed ``sweep.png`` cannot
ride along. Everything else is left out and named in the archive's BUNDLE.txt with the
reason: symbolic links (never followed), files nsadiag did not write, binary files that
cannot be redacted (snapshot.pickle), files above MAX_FILE_BYTES, nsadiag's private files
(redaction.json holds the values it hides). The archive is written to an exclusive
temporary beside its name and renamed over it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import struct
import tarfile
import tempfile
import time
import zlib
from pathlib import Path, PurePosixPath

from nsadiag.redact import Redactor, host_pseudonyms
from nsadiag.report.dispatch import LOCK_WAIT_S, render_run
from nsadiag.rundir import FILE_MODE, locked, open_regular, stored_redaction
from nsadiag.store.owned import PRIVATE, check_run_dir, written_by_nsadiag, written_dir

TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".txt", ".folded"}
PNG_SUFFIX = ".png"
MAX_FILE_BYTES = 32 * 2**20
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_KEPT_CHUNKS = frozenset({b"IHDR", b"PLTE", b"tRNS", b"gAMA", b"IDAT", b"IEND"})
"""The chunks a plot needs to be drawn; text (tEXt, zTXt, iTXt), EXIF and the rest go."""


def bundle_path(run_dir: Path) -> Path:
    """Where the bundle of ``run_dir`` goes: inside it, named after it."""
    return run_dir / f"{run_dir.resolve().name}-redacted.tar.gz"


def _redacted(data: bytes, suffix: str, redactor: Redactor) -> bytes:
    text = data.decode(errors="replace")
    if suffix == ".json":
        with contextlib.suppress(json.JSONDecodeError, RecursionError):
            return (json.dumps(redactor.obj(json.loads(text)), indent=1) + "\n").encode()
    if suffix == ".jsonl":
        lines = []
        for line in text.splitlines():
            try:
                lines.append(json.dumps(redactor.obj(json.loads(line))))
            except (json.JSONDecodeError, RecursionError):
                lines.append(redactor.text(line))
        return ("\n".join(lines) + "\n").encode()
    return redactor.text(text).encode()


def clean_png(data: bytes) -> bytes | None:
    """The image chunks of a well-formed PNG (every chunk's CRC right, IHDR first, IEND
    last), rebuilt without text or anything appended; None for anything else."""
    if not data.startswith(PNG_SIGNATURE):
        return None
    kept, offset, first = [PNG_SIGNATURE], len(PNG_SIGNATURE), True
    while offset + 12 <= len(data):
        (length,) = struct.unpack(">I", data[offset:offset + 4])
        kind = data[offset + 4:offset + 8]
        end = offset + 12 + length
        if end > len(data):
            return None
        body = data[offset + 8:offset + 8 + length]
        if struct.unpack(">I", data[end - 4:end])[0] != zlib.crc32(kind + body):
            return None
        if first and kind != b"IHDR":
            return None
        first = False
        if kind in PNG_KEPT_CHUNKS:
            kept.append(data[offset:end])
        if kind == b"IEND":
            return b"".join(kept)
        offset = end
    return None


def _file_data(run_dir: Path, relative: PurePosixPath, redactor: Redactor
               ) -> tuple[bytes | None, str | None]:
    """(what goes into the bundle, None) for one entry, or (None, why it is left out)."""
    path = run_dir / relative
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return None, "a symbolic link, not followed"
    if not stat.S_ISREG(info.st_mode):
        return None, "not a regular file"
    if relative.name in PRIVATE and len(relative.parts) == 1:
        return None, "nsadiag's private bookkeeping (what redaction hides)"
    if not written_by_nsadiag(relative):
        return None, "not written by nsadiag"
    if info.st_nlink != 1:
        return None, "a hard link (it may be a file outside the directory)"
    if info.st_size > MAX_FILE_BYTES:
        return None, f"larger than {MAX_FILE_BYTES // 2**20} MiB"
    if relative.suffix not in TEXT_SUFFIXES and relative.suffix != PNG_SUFFIX:
        return None, "binary, cannot be redacted"
    if not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(run_dir)):
        return None, "resolves outside the run directory"
    try:
        with open_regular(path, "bundle") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except ValueError:
        return None, "changed while it was read"
    if relative.suffix == PNG_SUFFIX:
        image = clean_png(data)
        return (image, None) if image is not None else (None, "not a well-formed PNG image")
    return _redacted(data, relative.suffix, redactor), None


def _entries(run_dir: Path, target: Path) -> list[tuple[PurePosixPath, bool]]:
    """(path relative to run_dir, whether it is a directory nsadiag did not make) of every
    entry to consider, in order, without following a link or entering a foreign directory;
    the bundle itself and its temporaries are not listed."""
    found: list[tuple[PurePosixPath, bool]] = []
    pending = [PurePosixPath()]
    while pending:
        here = pending.pop()
        with os.scandir(run_dir / here) as scan:
            for entry in sorted(scan, key=lambda e: e.name):
                relative = here / entry.name
                if not here.parts and (entry.name == target.name or
                                       entry.name.startswith(f".{target.name}.")):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if written_dir(entry.name):
                        pending.append(relative)
                    else:
                        found.append((relative, True))
                else:
                    found.append((relative, False))
    return sorted(found)


def write_bundle(run_dir: Path) -> Path:
    """Re-render the run redacted, then write its redacted archive; returns its path.
    ValueError (one line) when the directory holds no run, is in use or cannot be
    written."""
    check_run_dir(run_dir)  # before the lock: nothing is written into anything else
    with locked(run_dir, LOCK_WAIT_S):
        rendered = render_run(run_dir)
        return _write(run_dir, rendered.hosts)


def _write(run_dir: Path, hosts: list[str]) -> Path:
    target = bundle_path(run_dir)
    aliases = host_pseudonyms(hosts)
    redactor = Redactor.with_recorded(stored_redaction(run_dir), aliases)
    left_out: list[str] = []
    root = redactor.text(run_dir.resolve().name)
    try:
        fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as err:
        raise ValueError(f"bundle: cannot write {target}: {err.strerror or err}") from None
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for relative, foreign_dir in _entries(run_dir, target):
                name = redactor.text(relative.as_posix())
                if foreign_dir:
                    left_out.append(f"{name}/: a directory nsadiag did not make, not read")
                    continue
                data, why = _file_data(run_dir, relative, redactor)
                if data is None:
                    left_out.append(f"{name}: {why}")
                    continue
                _add(tar, f"{root}/{name}", data)
            manifest = ["A redacted copy of an nsadiag run directory (nsadiag report --bundle).",
                        "Host names, IP addresses, user names and secret-looking values are "
                        "hidden in every file; only files nsadiag wrote there are copied.",
                        *([f"The job's {len(aliases)} host(s) are named "
                           f"{', '.join(aliases.values())} (in the order of their first rank), "
                           "the same name for the same host in every file."]
                          if aliases else []), "", "Left out:"]
            manifest += [f"- {entry}" for entry in left_out] or ["- nothing"]
            _add(tar, f"{root}/BUNDLE.txt", ("\n".join(manifest) + "\n").encode())
            tar.close()
            raw.flush()
            os.fchmod(raw.fileno(), FILE_MODE)
            os.fsync(raw.fileno())
        os.replace(tmp, target)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ValueError(f"bundle: cannot write {target}: {err.strerror or err}") from None
    return target


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))
