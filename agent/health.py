"""``node.health``: a summary of the node (protocol "Commands built in").

Used as the result of the ``node.health`` command and, periodically, as a
``node.health`` telemetry record. ``problems`` holds one sentence per thing an
operator should look at; ``ok`` is true when there is none.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from agent.inventory.gpus import gpu_health
from agent.inventory.nics import collect_nics
from agent.inventory.paths import HostPaths, read_int, read_text

MIN_DISK_FREE_BYTES = 1 << 30
MIN_MEMORY_AVAILABLE_FRACTION = 0.02


def _meminfo(paths: HostPaths) -> dict[str, int]:
    out = {}
    for line in (read_text(paths.proc / "meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def _first_float(text: str | None) -> float | None:
    try:
        return float(text.split()[0]) if text else None
    except (ValueError, IndexError):
        return None


def node_health(paths: HostPaths, nvml: Any, state_dir: Path | None = None) -> dict:
    problems: list[str] = []
    mem = _meminfo(paths)
    available = mem.get("MemAvailable")
    total = mem.get("MemTotal")
    if available is not None and total and available < total * MIN_MEMORY_AVAILABLE_FRACTION:
        problems.append(f"Only {available >> 20} MiB of {total >> 20} MiB memory is available.")
    disk_free = None
    if state_dir is not None:
        try:
            disk_free = shutil.disk_usage(state_dir).free
        except OSError:
            disk_free = None
        if disk_free is not None and disk_free < MIN_DISK_FREE_BYTES:
            problems.append(f"Only {disk_free >> 20} MiB free on the file system of {state_dir}.")
    gpus, gpu_errors = gpu_health(nvml)
    for err in gpu_errors:
        if "Library Not Found" not in err:
            problems.append(f"GPU health could not be fully read ({err}).")
    for gpu in gpus:
        label = f"GPU {gpu['index']}" + (f" ({gpu['uuid']})" if gpu.get("uuid") else "")
        if not gpu.get("reachable", True):
            problems.append(f"{label} is not reachable through NVML.")
            continue
        if gpu.get("ecc_uncorrected"):
            problems.append(f"{label} reports {gpu['ecc_uncorrected']} uncorrected ECC errors since the driver loaded.")
        if gpu.get("remapped_rows_failure"):
            problems.append(f"{label} failed to remap a memory row; it needs service.")
        elif gpu.get("remapped_rows_pending"):
            problems.append(f"{label} has a pending row remap; reset it when it is idle.")
    nics = []
    nic_list, _ = collect_nics(paths, {})
    for nic in nic_list:
        entry = {"device": nic["device"], "link_state": nic["link_state"]}
        stats = paths.sys / "class" / "net" / nic["device"] / "statistics"
        entry["rx_errors"] = read_int(stats / "rx_errors")
        entry["tx_errors"] = read_int(stats / "tx_errors")
        nics.append(entry)
    return {
        "load1": _first_float(read_text(paths.proc / "loadavg")),
        "memory_available_bytes": available,
        "disk_free_bytes": disk_free,
        "uptime_s": _first_float(read_text(paths.proc / "uptime")),
        "gpus": gpus,
        "nics": nics,
        "ok": not problems,
        "problems": problems,
    }
