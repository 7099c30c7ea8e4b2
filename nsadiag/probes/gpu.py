"""GPU state from NVML (nvidia-ml-py): utilisation, memory, clocks, power, throttle reasons
and per-process memory for every device. Without a driver it returns the reason instead."""

from __future__ import annotations

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
