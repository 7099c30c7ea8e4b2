"""A redacted archive of a run directory, for sharing: `nsadiag report DIR --bundle`.

The run directory itself keeps raw data (trial heartbeats, stacks, the command's output);
the bundle holds a redacted copy of every text file in it (JSON structurally, JSON Lines
line by line, the rest as text; see nsadiag.report.redact) and the plots, after
re-rendering report.md and summary.json redacted. Binary files that cannot be redacted
(snapshot.pickle, core dumps) and files above MAX_FILE_BYTES are left out; BUNDLE.txt in
the archive lists what was left out and why.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path

from nsadiag.report.dispatch import render_run
from nsadiag.report.redact import Redactor

TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".txt", ".folded", ".csv", ".log", ".py"}
COPIED_SUFFIXES = {".png"}
MAX_FILE_BYTES = 32 * 2**20


def bundle_path(run_dir: Path) -> Path:
    """Where the bundle of ``run_dir`` goes: inside it, named after it."""
    return run_dir / f"{run_dir.resolve().name}-redacted.tar.gz"


def _redacted(path: Path, redactor: Redactor) -> bytes:
    text = path.read_text(errors="replace")
    if path.suffix == ".json":
        try:
            return (json.dumps(redactor.obj(json.loads(text)), indent=1) + "\n").encode()
        except json.JSONDecodeError:
            pass
    if path.suffix == ".jsonl":
        lines = []
        for line in text.splitlines():
            try:
                lines.append(json.dumps(redactor.obj(json.loads(line))))
            except json.JSONDecodeError:
                lines.append(redactor.text(line))
        return ("\n".join(lines) + "\n").encode()
    return redactor.text(text).encode()


def write_bundle(run_dir: Path) -> Path:
    """Re-render the run redacted, then write its redacted archive; returns its path.
    ValueError (one line) when the directory holds no run or cannot be written."""
    render_run(run_dir)
    target = bundle_path(run_dir)
    redactor = Redactor()
    left_out: list[str] = []
    tmp = target.with_name(f".{target.name}.tmp")
    root = redactor.text(run_dir.resolve().name)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
                name = path.relative_to(run_dir).as_posix()
                if path.name.endswith("-redacted.tar.gz") or path.name.startswith("."):
                    continue
                if path.stat().st_size > MAX_FILE_BYTES:
                    left_out.append(f"{name}: larger than {MAX_FILE_BYTES // 2**20} MiB")
                    continue
                if path.suffix in TEXT_SUFFIXES:
                    data = _redacted(path, redactor)
                elif path.suffix in COPIED_SUFFIXES:
                    data = path.read_bytes()
                else:
                    left_out.append(f"{name}: binary, cannot be redacted")
                    continue
                _add(tar, f"{root}/{redactor.text(name)}", data)
            manifest = ["A redacted copy of an nsadiag run directory (nsadiag report --bundle).",
                        "Host names, IP addresses, user names and secret-looking values are "
                        "hidden in every file.", "", "Left out:"]
            manifest += [f"- {entry}" for entry in left_out] or ["- nothing"]
            _add(tar, f"{root}/BUNDLE.txt", ("\n".join(manifest) + "\n").encode())
        tmp.replace(target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise ValueError(f"bundle: cannot write {target}: {err.strerror or err}") from None
    return target


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))
