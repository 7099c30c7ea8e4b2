"""The environment a diagnosis runs in: versions, devices, profilers and their permissions.

Every probe degrades to a line that says why a piece is unavailable; nothing raises.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EnvReport:
    """The environment (``collect_env``). Read back from a run's records (``from_dict``),
    a field the stored copy lacks is None (or empty)."""

    python: str | None
    platform: str | None
    cpu_count: int | None
    packages: dict[str, str]
    torch_threads: int | None
    cuda: str | None
    devices: list[str]
    allocator_conf: str | None
    py_spy: str | None
    ptrace: str | None
    nvml: str | None
    notes: list[str] = field(default_factory=list)
    usable_cpus: int | None = None
    load_average: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def torch(self) -> str | None:
        """The installed torch's version, None when the report names none."""
        return self.packages.get("torch")

    @classmethod
    def from_dict(cls, data: Any) -> EnvReport:
        """A stored environment (run.json's ``env``, triage.json's); TypeError naming a
        field of the wrong type."""
        if not isinstance(data, dict):
            raise TypeError(f"env: must be an object, got {type(data).__name__}")
        values: dict[str, Any] = {}
        for name, kinds in _STORED_TYPES.items():
            value = data[name] if name in data else None
            if value is not None and (not isinstance(value, kinds) or
                                      (isinstance(value, bool) and bool not in kinds)):
                raise TypeError(f"env.{name}: got {type(value).__name__}")
            values[name] = value
        for name, empty in (("packages", dict), ("devices", list), ("notes", list),
                            ("load_average", list)):
            values[name] = empty(values[name] or empty())
        return cls(**values)


_STORED_TYPES: dict[str, type | tuple[type, ...]] = {
    "python": str, "platform": str, "cpu_count": int, "packages": dict, "torch_threads": int,
    "cuda": str, "devices": list, "allocator_conf": str, "py_spy": str, "ptrace": str,
    "nvml": str, "notes": list, "usable_cpus": int, "load_average": list}
"""What each field of a stored EnvReport must be when set."""


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _py_spy() -> str:
    from nsadiag.probes.stacks import py_spy_path

    exe = py_spy_path()
    if exe is None:
        return "not found (pip install py-spy)"
    try:
        done = subprocess.run([str(exe), "--version"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"unusable: {err}"
    return done.stdout.strip() or done.stderr.strip() or "unknown version"


def ptrace_permission() -> str:
    """Whether py-spy may attach to processes of this user (Yama ptrace_scope, root)."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read().strip())
    except (OSError, ValueError):
        scope = None
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    if scope is None:
        return "allowed (no Yama ptrace restriction found)"
    if scope == 0 or (root and scope < 3):
        return f"allowed (ptrace_scope={scope}{', root' if root else ''})"
    if scope == 1:
        return ("children only (ptrace_scope=1): stacks of watched child processes work; "
                "to attach elsewhere run as root or set kernel.yama.ptrace_scope=0")
    return f"refused (ptrace_scope={scope}): py-spy cannot attach; stacks fall back to faulthandler"


def _nvml() -> str:
    try:
        import pynvml
    except ImportError:
        return "not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # NVMLError has many subclasses; any of them means "no driver"
        return f"not available on this machine: {err}"
    try:
        return f"driver {pynvml.nvmlSystemGetDriverVersion()}, {pynvml.nvmlDeviceGetCount()} GPU(s)"
    finally:
        pynvml.nvmlShutdown()


def triton_kernels(cuda_available: bool) -> str:
    """How NSA's triton backend would run here (its kernels are built on import)."""
    from nsadiag.builtin import builtin_nsa_available

    if importlib.util.find_spec("triton") is None:
        return "triton kernels: not usable (triton is not installed: pip install -e '.[triton]')"
    if not builtin_nsa_available():
        return "triton kernels: not checked (the `nsa` on sys.path is not nsa-diag's)"
    try:
        from nsa.ops.triton import ops
    except Exception as err:  # a broken triton install raises anything on import
        return f"triton kernels: not usable ({type(err).__name__}: {err})"
    if ops.INTERPRETED:
        return ("triton kernels: CPU interpreter (TRITON_INTERPRET=1): correct but slow; "
                "backend auto stays on torch")
    if cuda_available:
        return "triton kernels: compiled for CUDA; backend auto uses them for supported shapes"
    return "triton kernels: need a CUDA device; backend auto uses the torch backend here"


def machine_load() -> tuple[int | None, list[float]]:
    """CPUs this process may run on and the 1, 5 and 15 minute load averages (each empty
    or None where the platform does not tell)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = []
    return usable, load


def collect_env() -> EnvReport:
    """Gather the report; importing torch is the slowest part (about a second)."""
    usable, load = machine_load()
    packages = {name: _version(name) for name in
                ("torch", "triton", "numpy", "py-spy", "nvidia-ml-py", "nsa-diag")}
    notes: list[str] = []
    try:
        import torch
    except ImportError:
        return EnvReport(sys.version.split()[0], platform.platform(), os.cpu_count() or 0,
                         packages, None, "torch not installed", [], "", _py_spy(),
                         ptrace_permission(), _nvml(), ["install torch first"], usable,
                         load)
    if torch.cuda.is_available():
        cuda = f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} device(s)"
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        cuda = ("not available on this device (CPU build of torch)" if torch.version.cuda is None
                else f"not available on this device (torch built for CUDA {torch.version.cuda})")
        devices = []
        notes.append("CUDA memory statistics and snapshots are not available on this device")
    notes.append(triton_kernels(torch.cuda.is_available()))
    allocator = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "default"
    return EnvReport(sys.version.split()[0], platform.platform(), os.cpu_count() or 0, packages,
                     torch.get_num_threads(), cuda, devices, allocator, _py_spy(),
                     ptrace_permission(), _nvml(), notes, usable, load)
