"""GPU state from NVML (nvidia-ml-py): utilisation, memory, clocks, power, throttle reasons
and per-process memory for every device. Without a driver it returns the reason instead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def gpu_state() -> list[dict[str, Any]] | str:
    """One dict per device, or a one-line reason string when NVML is unavailable."""
    try:
        import pynvml
    except ImportError:
        return "gpu: nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as err:  # every NVMLError subclass means the same here: no driver
        return f"gpu: NVML not available on this machine ({err})"
    try:
        return [_device(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def _device(nvml, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    util = nvml.nvmlDeviceGetUtilizationRates(handle)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    state = {"index": index, "name": _text(nvml.nvmlDeviceGetName(handle)),
             "util_gpu_pct": util.gpu, "util_mem_pct": util.memory,
             "mem_used": memory.used, "mem_total": memory.total}
    optional = {
        "sm_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
        "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        "throttle_reasons": lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "processes": lambda: [{"pid": p.pid, "mem_used": p.usedGpuMemory} for p in
                              nvml.nvmlDeviceGetComputeRunningProcesses(handle)],
    }
    for key, read in optional.items():
        try:
            state[key] = read()
        except Exception as err:  # a field some devices or drivers do not report
            state[key] = f"unavailable ({err})"
    return state


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---- the state as a record stores it ---------------------------------------------------------

Reading = int | float | str
"""An NVML field a device may not report: its value, or "unavailable (why)"."""


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a device (NVML's per-process row)."""

    pid: int
    mem_used: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "mem_used": self.mem_used}


@dataclass(frozen=True)
class GpuDevice:
    """One device's row of ``gpu_state``: the fields every device reports, and those a
    device or driver may not (None when the row lacks the field)."""

    index: int
    name: str
    util_gpu_pct: int | float
    util_mem_pct: int | float
    mem_used: int
    mem_total: int
    sm_clock_mhz: Reading | None = None
    mem_clock_mhz: Reading | None = None
    power_w: Reading | None = None
    throttle_reasons: Reading | None = None
    processes: tuple[GpuProcess, ...] | str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuDevice:
        """A stored row; TypeError or KeyError naming what is wrong."""
        if not isinstance(data, dict):
            raise TypeError(f"gpu: a device row must be an object, got {type(data).__name__}")
        for key, kinds in _REQUIRED.items():
            if not isinstance(data[key], kinds) or isinstance(data[key], bool):
                raise TypeError(f"gpu.{key}: must be {kinds[-1].__name__}, got "
                                f"{type(data[key]).__name__}")
        for key in _OPTIONAL:
            if not isinstance(data.get(key), (int, float, str, type(None))):
                raise TypeError(f"gpu.{key}: must be a number or a string, got "
                                f"{type(data[key]).__name__}")
        processes = data.get("processes")
        if isinstance(processes, list):
            processes = tuple(GpuProcess(int(p["pid"]), p["mem_used"]) for p in processes)
        elif not isinstance(processes, (str, type(None))):
            raise TypeError(f"gpu.processes: must be a list or a string, got "
                            f"{type(processes).__name__}")
        return cls(**{key: data[key] for key in _REQUIRED},
                   **{key: data.get(key) for key in _OPTIONAL}, processes=processes)

    def to_dict(self) -> dict[str, Any]:
        """The row as ``gpu_state`` wrote it (a field the device lacked left out)."""
        data: dict[str, Any] = {key: getattr(self, key) for key in _REQUIRED}
        data.update((key, getattr(self, key)) for key in _OPTIONAL
                    if getattr(self, key) is not None)
        if self.processes is not None:
            data["processes"] = self.processes if isinstance(self.processes, str) else \
                [p.to_dict() for p in self.processes]
        return data


_REQUIRED: dict[str, tuple[type, ...]] = {
    "index": (int,), "name": (str,), "util_gpu_pct": (int, float),
    "util_mem_pct": (int, float), "mem_used": (int,), "mem_total": (int,)}
_OPTIONAL = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "throttle_reasons")


@dataclass(frozen=True)
class GpuUnavailable:
    """Why no device could be read (nvidia-ml-py missing, no driver): the line ``gpu_state``
    returned instead of the rows."""

    reason: str

    def __str__(self) -> str:
        return self.reason


GpuState = tuple[GpuDevice, ...] | GpuUnavailable
"""What a record keeps of the GPUs when its trial was stopped."""


def gpu_of(data: list[Any] | str | None) -> GpuState | None:
    """``gpu_state``'s value (or a stored record's copy of it) typed; TypeError or KeyError
    for one of another shape."""
    if data is None:
        return None
    if isinstance(data, str):
        return GpuUnavailable(data)
    if not isinstance(data, list):
        raise TypeError(f"gpu: must be a list of devices or a string, got "
                        f"{type(data).__name__}")
    return tuple(GpuDevice.from_dict(row) for row in data)


def gpu_json(state: GpuState | None) -> list[dict[str, Any]] | str | None:
    """The JSON form of ``gpu_of``'s value: what ``gpu_state`` returned."""
    if state is None or isinstance(state, GpuUnavailable):
        return None if state is None else state.reason
    return [device.to_dict() for device in state]
