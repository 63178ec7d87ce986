"""GPUs through NVML (the ``pynvml`` module of nvidia-ml-py).

The real ``pynvml`` is the default: :func:`load_nvml` imports it when it is
installed. Tests pass a faithful fake with the same functions and errors
(``tests/agent/fakes/nvml_fake.py``). Without the module, or without
``libnvidia-ml.so.1`` (``NVMLError_LibraryNotFound``), or without a loaded
driver, the node reports no GPUs and says why in ``errors``.

NVML calls used: nvmlInit, nvmlShutdown, nvmlSystemGetDriverVersion,
nvmlSystemGetCudaDriverVersion, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetPciInfo, nvmlDeviceGetMemoryInfo,
nvmlDeviceGetEccMode, nvmlDeviceGetNvLinkState; for health also
nvmlDeviceGetTemperature, nvmlDeviceGetTotalEccErrors, nvmlDeviceGetPowerUsage,
nvmlDeviceGetRemappedRows.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from agent.inventory.paths import HostPaths
from agent.inventory.pcie import normalize_bus_id, numa_node_of

_NOT_PRESENT = "nvml: the nvidia-ml-py package (pynvml) is not installed"
_init_lock = threading.Lock()


def load_nvml() -> tuple[Any, str | None]:
    """The real pynvml module, or None and the reason."""
    try:
        import pynvml  # noqa: PLC0415 - optional dependency, imported only when present
    except ImportError:
        return None, _NOT_PRESENT
    return pynvml, None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_version(encoded: int) -> str:
    """NVML's 12070 -> "12.7"."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def _init(nvml: Any) -> str | None:
    """nvmlInit; the error sentence if it fails (NVML reference-counts initialisations)."""
    try:
        with _init_lock:
            nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return f"nvml: {exc}"
    return None


def _shutdown(nvml: Any) -> None:
    with _init_lock, contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def _is(nvml: Any, exc: Exception, *names: str) -> bool:
    value = getattr(exc, "value", None)
    return any(value == getattr(nvml, name, object()) for name in names)


def _field(nvml: Any, errors: list[str], where: str, func: Callable[[], Any], default: Any = None) -> Any:
    try:
        return func()
    except nvml.NVMLError as exc:
        if _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
            return default
        errors.append(f"nvml: {where}: {exc}")
        return default


def _nvlinks(nvml: Any, handle: Any, errors: list[str], where: str) -> list[dict]:
    links = []
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 36)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as exc:
            # PCIe cards: NOT_SUPPORTED on link 0. NVLink GPUs: INVALID_ARGUMENT past their last link.
            if not _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                errors.append(f"nvml: {where} nvlink {link}: {exc}")
            break
        links.append({"link": link, "active": state == enabled})
    return links


def collect_gpus(nvml: Any, paths: HostPaths, reason: str | None = None) -> tuple[list[dict], list[str]]:
    """GPUs for the inventory, and what could not be read."""
    if nvml is None:
        return [], [reason or _NOT_PRESENT]
    errors: list[str] = []
    gpus: list[dict] = []
    failure = _init(nvml)
    if failure:
        return [], [failure]
    try:
        driver = _text(_field(nvml, errors, "driver version", nvml.nvmlSystemGetDriverVersion, ""))
        cuda_raw = _field(nvml, errors, "CUDA version", nvml.nvmlSystemGetCudaDriverVersion, None)
        cuda = cuda_version(cuda_raw) if isinstance(cuda_raw, int) else ""
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            return [], [f"nvml: device count: {exc}"]
        for index in range(count):
            where = f"GPU {index}"
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                errors.append(f"nvml: {where}: {exc}")
                continue
            pci = _field(nvml, errors, f"{where} PCI info", lambda h=handle: nvml.nvmlDeviceGetPciInfo(h))
            bus_id = normalize_bus_id(_text(pci.busId)) if pci is not None else ""
            memory = _field(nvml, errors, f"{where} memory", lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h))
            ecc = _field(nvml, errors, f"{where} ECC mode", lambda h=handle: nvml.nvmlDeviceGetEccMode(h))
            gpus.append(
                {
                    "index": index,
                    "name": _text(_field(nvml, errors, f"{where} name", lambda h=handle: nvml.nvmlDeviceGetName(h), "")),
                    "uuid": _text(_field(nvml, errors, f"{where} UUID", lambda h=handle: nvml.nvmlDeviceGetUUID(h), "")),
                    "pci_bus_id": bus_id,
                    "memory_bytes": int(memory.total) if memory is not None else None,
                    "driver_version": driver,
                    "cuda_version": cuda,
                    "ecc_enabled": (ecc[0] == getattr(nvml, "NVML_FEATURE_ENABLED", 1)) if ecc is not None else None,
                    "numa_node": numa_node_of(paths, bus_id) if bus_id else None,
                    "nvlinks": _nvlinks(nvml, handle, errors, where),
                }
            )
    finally:
        _shutdown(nvml)
    return gpus, errors


def gpu_health(nvml: Any) -> tuple[list[dict], list[str]]:
    """Per-GPU health counters for ``node.health``; errors say what could not be read."""
    if nvml is None:
        return [], []
    errors: list[str] = []
    out: list[dict] = []
    failure = _init(nvml)
    if failure:
        return [], [failure]
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            where = f"GPU {index}"
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                errors.append(f"nvml: {where}: {exc}")
                out.append({"index": index, "reachable": False})
                continue
            temp = _field(nvml, errors, f"{where} temperature",
                          lambda h=h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
            ecc_unc = _field(nvml, errors, f"{where} ECC errors", lambda h=h: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC))
            power = _field(nvml, errors, f"{where} power", lambda h=h: nvml.nvmlDeviceGetPowerUsage(h))
            rows = _field(nvml, errors, f"{where} remapped rows", lambda h=h: nvml.nvmlDeviceGetRemappedRows(h))
            out.append(
                {
                    "index": index,
                    "uuid": _text(_field(nvml, errors, f"{where} UUID", lambda h=h: nvml.nvmlDeviceGetUUID(h), "")),
                    "reachable": True,
                    "temperature_c": temp,
                    "ecc_uncorrected": ecc_unc,
                    "power_w": round(power / 1000.0, 1) if isinstance(power, (int, float)) else None,
                    "remapped_rows_pending": bool(rows[2]) if rows is not None else None,
                    "remapped_rows_failure": bool(rows[3]) if rows is not None else None,
                }
            )
    except nvml.NVMLError as exc:
        errors.append(f"nvml: device count: {exc}")
    finally:
        _shutdown(nvml)
    return out, errors
