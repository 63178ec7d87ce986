"""Collect the facts the audit checks evaluate: NVML, sysfs, procfs, the kernel log. I/O only.

Everything returned is plain JSON (numbers, strings, lists, dicts): the facts travel in the
command's result as evidence, and the pure checks (``agent.audit.gpu``, ``.pcie``, ``.nic``,
``.affinity``, ``.host``) evaluate them. Nothing here raises for a missing piece: a value that
cannot be read is ``None`` and the reason goes to ``errors``; a value the hardware does not
have (NVML ``NOT_SUPPORTED``) is ``None`` without an error.

A recorded host tree (``tests/agent/data/<name>/``: ``sys/``, ``proc/``, ``etc/``) may also hold
``dmesg.txt`` (the kernel log), ``adjtimex.json`` (the kernel clock state), ``usr/`` (libraries,
``/usr/local/cuda/version.json``) and ``ethtool.json`` (``ethtool -i`` per interface).

NVML calls used, beyond the inventory's: nvmlDeviceGetPersistenceMode,
nvmlDeviceGetTotalEccErrors, nvmlDeviceGetMemoryErrorCounter, nvmlDeviceGetRetiredPages,
nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetRemappedRows,
nvmlDeviceGetRowRemapperHistogram, nvmlDeviceGetCurrentClocksEventReasons (or the older
...ThrottleReasons), nvmlDeviceGetTemperature, nvmlDeviceGetTemperatureThreshold,
nvmlDeviceGetFieldValues (NVML_FI_DEV_MEMORY_TEMP), nvmlDeviceGetPowerUsage,
nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetPowerManagementDefaultLimit,
nvmlDeviceGet{Curr,Max,GpuMax}PcieLink{Generation,Width}, nvmlDeviceGetPcieReplayCounter,
nvmlDeviceGetNvLinkErrorCounter, nvmlDeviceGetGpuFabricInfo, and the event API
(nvmlEventSetCreate, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2, nvmlEventSetFree) for Xids
raised while the check listens.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import glob
import json
import os
import re
import socket
import struct
import time
from pathlib import Path
from typing import Any

from agent.inventory.gpus import _init, _is, _shutdown, _text
from agent.inventory.host import host_facts
from agent.inventory.nics import collect_nics
from agent.inventory.paths import HostPaths, read_int, read_text
from agent.inventory.pcie import chain_of, normalize_bus_id, pci_device_dir

_NOT_PRESENT = "nvml: the nvidia-ml-py package (pynvml) is not installed"
_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
_NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")  # NVML_NVLINK_ERROR_DL_* 0..4
_GTS_TO_GEN = {"2.5": 1, "5": 2, "5.0": 2, "8": 3, "8.0": 3, "16": 4, "16.0": 4, "32": 5, "32.0": 5, "64": 6,
               "64.0": 6, "128": 7, "128.0": 7}
ACS_EXT_CAP_ID = 0x000D
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "usr/local/lib",
            "usr/local/cuda/lib64", "usr/local/nccl/lib", "opt/nccl/lib")


def host_root(paths: HostPaths) -> Path:
    """Where /usr, the kernel log dump and other recorded files live: / live, the tree root otherwise."""
    return Path("/") if paths.live else paths.sys.parent


class _Reader:
    """Calls NVML functions, keeping NOT_SUPPORTED quiet and every other error in ``errors``."""

    def __init__(self, nvml: Any, errors: list[str]):
        self.nvml = nvml
        self.errors = errors
        self.lost = False

    def __call__(self, where: str, name: str, *args: Any) -> Any:
        func = getattr(self.nvml, name, None)
        if func is None:
            return None
        try:
            return func(*args)
        except self.nvml.NVMLError as exc:
            if _is(self.nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
                return None
            if _is(self.nvml, exc, "NVML_ERROR_GPU_IS_LOST"):
                self.lost = True
            self.errors.append(f"nvml: {where}: {name}: {exc}")
            return None


def _c(nvml: Any, name: str, default: int) -> int:
    return getattr(nvml, name, default)


def _byref(obj: Any) -> Any:
    return ctypes.byref(obj) if isinstance(obj, (ctypes.Structure, ctypes.Union, ctypes.Array)) else obj


def _ecc(read: _Reader, nvml: Any, handle: Any, where: str) -> dict | None:
    corrected = _c(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    uncorrected = _c(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile, aggregate = _c(nvml, "NVML_VOLATILE_ECC", 0), _c(nvml, "NVML_AGGREGATE_ECC", 1)
    out: dict[str, Any] = {}
    for cname, ctype in (("volatile", volatile), ("aggregate", aggregate)):
        out[cname] = {ename: read(where, "nvmlDeviceGetTotalEccErrors", handle, etype, ctype)
                      for ename, etype in (("corrected", corrected), ("uncorrected", uncorrected))}
    for lname, loc in (("dram", _c(nvml, "NVML_MEMORY_LOCATION_DRAM", 2)), ("sram", _c(nvml, "NVML_MEMORY_LOCATION_SRAM", 7))):
        out[lname] = {f"{ename}_{cname}": read(where, "nvmlDeviceGetMemoryErrorCounter", handle, etype, ctype, loc)
                      for cname, ctype in (("volatile", volatile), ("aggregate", aggregate))
                      for ename, etype in (("corrected", corrected), ("uncorrected", uncorrected))}
    if all(v is None for v in out["volatile"].values()) and all(v is None for v in out["aggregate"].values()):
        return None
    return out


def _retired_pages(read: _Reader, nvml: Any, handle: Any, where: str) -> dict | None:
    sbe = read(where, "nvmlDeviceGetRetiredPages", handle,
               _c(nvml, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0))
    dbe = read(where, "nvmlDeviceGetRetiredPages", handle, _c(nvml, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
    pending = read(where, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    if sbe is None and dbe is None and pending is None:
        return None  # row-remapping GPUs (Ampere and newer) answer NOT_SUPPORTED
    return {"sbe": len(sbe or []), "dbe": len(dbe or []), "pending": bool(pending)}


def _remapped_rows(read: _Reader, handle: Any, where: str) -> tuple[dict | None, dict | None]:
    rows = read(where, "nvmlDeviceGetRemappedRows", handle)
    if rows is None:
        return None, None
    corr, unc, pending, failure = rows
    hist = read(where, "nvmlDeviceGetRowRemapperHistogram", handle)
    histogram = None
    if hist is not None:
        histogram = {k: int(getattr(hist, k)) for k in ("max", "high", "partial", "low", "none")}
    return {"correctable": int(corr), "uncorrectable": int(unc), "pending": bool(pending),
            "failure": bool(failure)}, histogram


def _memory_temperature(read: _Reader, nvml: Any, handle: Any, where: str) -> int | None:
    field = getattr(nvml, "NVML_FI_DEV_MEMORY_TEMP", 82)
    values = read(where, "nvmlDeviceGetFieldValues", handle, [field])
    if not values:
        return None
    value = values[0]
    if getattr(value, "nvmlReturn", 1) != 0:
        return None
    raw = value.value
    # NVML reports it as an unsigned int (NVML_VALUE_TYPE_UNSIGNED_INT)
    return int(getattr(raw, "uiVal", raw))


def _fabric(read: _Reader, nvml: Any, handle: Any, where: str) -> dict | None:
    struct_type = getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if struct_type is None:
        return None
    info = struct_type()
    if read(where, "nvmlDeviceGetGpuFabricInfo", handle, _byref(info)) is None:
        return None
    state = _FABRIC_STATES.get(int(info.state), str(int(info.state)))
    if state == "not_supported":
        return None
    return {"state": state, "status": int(info.status)}


def _gpu(nvml: Any, index: int, errors: list[str]) -> dict:
    where = f"GPU {index}"
    read = _Reader(nvml, errors)
    gpu: dict[str, Any] = {"index": index, "reachable": True}
    handle = read(where, "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        gpu["reachable"] = False
        return gpu
    pci = read(where, "nvmlDeviceGetPciInfo", handle)
    name = read(where, "nvmlDeviceGetName", handle)
    uuid = read(where, "nvmlDeviceGetUUID", handle)
    gpu |= {
        "name": _text(name) if name is not None else "",
        "uuid": _text(uuid) if uuid is not None else "",
        "pci_bus_id": normalize_bus_id(_text(pci.busId)) if pci is not None else "",
        "pci_device_id": int(pci.pciDeviceId) if pci is not None else None,
    }
    if read.lost:
        gpu["reachable"] = False
        return gpu
    ecc_mode = read(where, "nvmlDeviceGetEccMode", handle)
    enabled = _c(nvml, "NVML_FEATURE_ENABLED", 1)
    gpu["persistence_mode"] = (lambda v: None if v is None else v == enabled)(
        read(where, "nvmlDeviceGetPersistenceMode", handle))
    gpu["ecc_mode"] = None if ecc_mode is None else {"current": ecc_mode[0] == enabled, "pending": ecc_mode[1] == enabled}
    gpu["ecc"] = _ecc(read, nvml, handle, where) if ecc_mode is not None else None
    gpu["retired_pages"] = _retired_pages(read, nvml, handle, where)
    gpu["remapped_rows"], gpu["remap_histogram"] = _remapped_rows(read, handle, where)
    reasons = read(where, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None and getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) is None:
        reasons = read(where, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    gpu["clocks_event_reasons"] = None if reasons is None else int(reasons)
    gpu["temperature_c"] = read(where, "nvmlDeviceGetTemperature", handle, _c(nvml, "NVML_TEMPERATURE_GPU", 0))
    gpu["memory_temperature_c"] = _memory_temperature(read, nvml, handle, where)
    gpu["temperature_thresholds_c"] = {
        key: read(where, "nvmlDeviceGetTemperatureThreshold", handle, _c(nvml, const, default))
        for key, const, default in (("shutdown", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN", 0),
                                    ("slowdown", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1),
                                    ("memory_max", "NVML_TEMPERATURE_THRESHOLD_MEM_MAX", 2),
                                    ("gpu_max", "NVML_TEMPERATURE_THRESHOLD_GPU_MAX", 3))
    }
    mw = {key: read(where, fn, handle) for key, fn in (("power", "nvmlDeviceGetPowerUsage"),
                                                       ("limit", "nvmlDeviceGetEnforcedPowerLimit"),
                                                       ("default", "nvmlDeviceGetPowerManagementDefaultLimit"))}
    gpu["power_w"] = None if mw["power"] is None else mw["power"] / 1000.0
    gpu["power_limit_w"] = None if mw["limit"] is None else mw["limit"] / 1000.0
    gpu["default_power_limit_w"] = None if mw["default"] is None else mw["default"] / 1000.0
    gpu["pcie"] = {key: read(where, fn, handle) for key, fn in (
        ("current_generation", "nvmlDeviceGetCurrPcieLinkGeneration"),
        ("max_generation", "nvmlDeviceGetMaxPcieLinkGeneration"),
        ("gpu_max_generation", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
        ("current_width", "nvmlDeviceGetCurrPcieLinkWidth"),
        ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
        ("replays", "nvmlDeviceGetPcieReplayCounter"),
    )}
    gpu["nvlinks"] = _nvlinks(nvml, handle, errors, where)
    gpu["fabric"] = _fabric(read, nvml, handle, where)
    if read.lost:
        gpu["reachable"] = False
    return gpu


def _nvlinks(nvml: Any, handle: Any, errors: list[str], where: str) -> list[dict]:
    links = []
    enabled = _c(nvml, "NVML_FEATURE_ENABLED", 1)
    read = _Reader(nvml, errors)
    for link in range(_c(nvml, "NVML_NVLINK_MAX_LINKS", 36)):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except nvml.NVMLError as exc:
            # PCIe cards: NOT_SUPPORTED on link 0; NVLink GPUs: INVALID_ARGUMENT past their last link
            if not _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"):
                errors.append(f"nvml: {where} nvlink {link}: {exc}")
            break
        entry: dict[str, Any] = {"link": link, "active": state == enabled}
        if entry["active"]:
            entry["errors"] = {name: read(f"{where} nvlink {link}", "nvmlDeviceGetNvLinkErrorCounter", handle, link, i)
                               for i, name in enumerate(_NVLINK_COUNTERS)}
        links.append(entry)
    return links


def _listen_xids(nvml: Any, count: int, listen_ms: int, errors: list[str]) -> list[dict]:
    """Xid events raised while we listen (NVML reports only new events, never history)."""
    if listen_ms <= 0 or count == 0 or getattr(nvml, "nvmlEventSetCreate", None) is None:
        return []
    xid_type = getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8)
    try:
        event_set = nvml.nvmlEventSetCreate()
    except nvml.NVMLError as exc:
        errors.append(f"nvml: event set: {exc}")
        return []
    events: list[dict] = []
    try:
        bus_of_handle = {}
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
                bus_of_handle[index] = normalize_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
            except nvml.NVMLError as exc:
                if not _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
                    errors.append(f"nvml: GPU {index} Xid events: {exc}")
        deadline = time.monotonic() + listen_ms / 1000.0
        while True:
            remaining = int((deadline - time.monotonic()) * 1000)
            if remaining <= 0:
                break
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, remaining)
            except nvml.NVMLError as exc:
                if not _is(nvml, exc, "NVML_ERROR_TIMEOUT"):
                    errors.append(f"nvml: waiting for Xid events: {exc}")
                break
            if int(data.eventType) & xid_type:
                bus = ""
                with contextlib.suppress(nvml.NVMLError, AttributeError):
                    bus = normalize_bus_id(_text(nvml.nvmlDeviceGetPciInfo(data.device).busId))
                events.append({"pci_bus_id": bus, "xid": int(data.eventData)})
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlEventSetFree(event_set)
    return events


def collect_gpu_facts(nvml: Any, reason: str | None = None, listen_ms: int = 0) -> dict:
    """``{"available", "driver_version", "cuda_driver_version", "gpus": [...], "xid_events": [...], "errors"}``."""
    errors: list[str] = []
    out: dict[str, Any] = {"available": False, "driver_version": "", "cuda_driver_version": "", "gpus": [],
                           "xid_events": [], "errors": errors}
    if nvml is None:
        errors.append(reason or _NOT_PRESENT)
        return out
    failure = _init(nvml)
    if failure:
        errors.append(failure)
        return out
    try:
        out["available"] = True
        read = _Reader(nvml, errors)
        driver = read("system", "nvmlSystemGetDriverVersion")
        cuda = read("system", "nvmlSystemGetCudaDriverVersion")
        out["driver_version"] = _text(driver) if driver is not None else ""
        out["cuda_driver_version"] = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else ""
        count = read("system", "nvmlDeviceGetCount")
        if count is None:
            return out
        out["gpus"] = [_gpu(nvml, i, errors) for i in range(count)]
        out["xid_events"] = _listen_xids(nvml, count, listen_ms, errors)
    finally:
        _shutdown(nvml)
    return out


# -- kernel log ---------------------------------------------------------------------------------


def read_kernel_log(paths: HostPaths, max_bytes: int = 8 << 20) -> tuple[str | None, str | None]:
    """(text, error): the kernel ring buffer (``/dev/kmsg`` live, ``dmesg.txt`` of a recorded tree)."""
    if not paths.live:
        path = host_root(paths) / "dmesg.txt"
        text = read_text(path)
        return (text or ""), None  # a tree without dmesg.txt: an empty log
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, f"kernel log: /dev/kmsg cannot be read ({exc}); Xids since boot are not known"
    chunks, total = [], 0
    try:
        while total < max_bytes:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: go on with the next record
                    continue
                return None, f"kernel log: reading /dev/kmsg failed ({exc})"
            if not record:
                break
            chunks.append(record)
            total += len(record)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace"), None


# -- PCIe (sysfs) ---------------------------------------------------------------------------------


def link_generation(speed: str | None) -> int | None:
    """sysfs ``32.0 GT/s PCIe`` (or ``8 GT/s``) -> 5 (or 3); None when unknown."""
    if not speed:
        return None
    m = re.match(r"^\s*([\d.]+)\s*GT/s", speed)
    return _GTS_TO_GEN.get(m.group(1)) if m else None


def acs_control(config: bytes) -> int | None:
    """The ACS Control register of a PCI config space dump, None when it has no ACS capability.

    Extended capabilities start at 0x100; each header is a little-endian dword: capability id
    (bits 0-15), version (16-19), next offset (20-31). ACS (id 0x000D) holds its capability
    register at +4 and its control register at +6 (PCIe base spec, "ACS Extended Capability").
    A dump of 256 bytes or less (read without root) has no extended space: None.
    """
    if len(config) < 0x104:
        return None
    offset, seen = 0x100, set()
    while 0x100 <= offset <= len(config) - 8 and offset not in seen:
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ACS_EXT_CAP_ID:
            (control,) = struct.unpack_from("<H", config, offset + 6)
            return control
        offset = (header >> 20) & 0xFFC
    return None


def _aer(path: Path) -> dict | None:
    text = read_text(path)
    if text is None:
        return None
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _pci_link(paths: HostPaths, bdf: str) -> dict:
    d = pci_device_dir(paths, bdf)
    info: dict[str, Any] = {
        "bdf": bdf,
        "current_generation": link_generation(read_text(d / "current_link_speed")),
        "max_generation": link_generation(read_text(d / "max_link_speed")),
        "current_width": read_int(d / "current_link_width"),
        "max_width": read_int(d / "max_link_width"),
    }
    for key, fname, total in (("aer_correctable", "aer_dev_correctable", "TOTAL_ERR_COR"),
                              ("aer_nonfatal", "aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
                              ("aer_fatal", "aer_dev_fatal", "TOTAL_ERR_FATAL")):
        counters = _aer(d / fname)
        info[key] = None if counters is None else counters.get(total, sum(counters.values()))
    return info


def _config_acs(paths: HostPaths, bdf: str) -> tuple[int | None, bool]:
    """(ACS control, readable): whether the extended config space could be read at all."""
    try:
        with open(pci_device_dir(paths, bdf) / "config", "rb") as fh:
            data = fh.read(4096)
    except OSError:
        return None, False
    if len(data) <= 256:
        return None, False
    return acs_control(data), True


def collect_pcie_facts(paths: HostPaths, devices: list[dict]) -> dict:
    """Links and the bridges above each device.

    ``devices``: ``[{"kind": "gpu"|"nic", "name": ..., "bdf": "0000:18:00.0"}]``. Each result has
    the device's link (current/max generation and width from sysfs, AER totals) and ``bridges``:
    the PCIe switch ports between the root port and the device (chain index >= 2), each with its
    link and its ACS control register. An upstream port's link is the one to its parent (the
    root port, or the downstream port of the switch above), whose maximum is kept beside it; a
    downstream port's link is its child's, judged at the child.
    """
    out: list[dict] = []
    errors: list[str] = []
    bridges: dict[str, dict] = {}
    for dev in devices:
        bdf = dev["bdf"]
        entry: dict[str, Any] = {"kind": dev["kind"], "name": dev["name"], "bdf": bdf, "link": None, "bridges": []}
        chain = chain_of(paths, pci_device_dir(paths, bdf))
        if chain is None:
            errors.append(f"pcie: {dev['kind']} {dev['name']} ({bdf}) is not in the PCI tree of {paths.sys}")
            out.append(entry)
            continue
        entry["link"] = _pci_link(paths, bdf)
        # chain: host bridge, root port, then switch ports in (upstream, downstream) pairs
        for i in range(2, len(chain) - 1):
            bridge = chain[i]
            if bridge not in bridges:
                acs, readable = _config_acs(paths, bridge)
                parent = chain[i - 1]
                bridges[bridge] = _pci_link(paths, bridge) | {
                    "role": "upstream" if i % 2 == 0 else "downstream", "parent": parent,
                    "parent_max_generation": link_generation(read_text(pci_device_dir(paths, parent) / "max_link_speed")),
                    "parent_max_width": read_int(pci_device_dir(paths, parent) / "max_link_width"),
                    "acs_control": acs, "config_readable": readable,
                }
            entry["bridges"].append(bridge)
        out.append(entry)
    return {"devices": out, "bridges": bridges, "errors": errors}


# -- NICs ------------------------------------------------------------------------------------------

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x00000003


class _DrvInfo(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_uint32), ("driver", ctypes.c_char * 32), ("version", ctypes.c_char * 32),
                ("fw_version", ctypes.c_char * 32), ("bus_info", ctypes.c_char * 32),
                ("erom_version", ctypes.c_char * 32), ("reserved2", ctypes.c_char * 12),
                ("n_priv_flags", ctypes.c_uint32), ("n_stats", ctypes.c_uint32), ("testinfo_len", ctypes.c_uint32),
                ("eedump_len", ctypes.c_uint32), ("regdump_len", ctypes.c_uint32)]


def ethtool_driver_info(ifname: str) -> dict | None:
    """``ethtool -i IFNAME``: driver, version, firmware, bus (ETHTOOL_GDRVINFO ioctl), None if refused."""
    info = _DrvInfo(cmd=ETHTOOL_GDRVINFO)
    ifreq = struct.pack("16sP", ifname.encode()[:15], ctypes.addressof(info))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
    except OSError:
        return None
    return {"driver": info.driver.decode(errors="replace"), "version": info.version.decode(errors="replace"),
            "firmware": info.fw_version.decode(errors="replace"), "bus_info": info.bus_info.decode(errors="replace")}


def _recorded_ethtool(paths: HostPaths) -> dict:
    text = read_text(host_root(paths) / "ethtool.json")
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}


def collect_nic_facts(paths: HostPaths) -> dict:
    """Every reported NIC (inventory rules) with driver, firmware, IB port state and error counters."""
    nics, errors = collect_nics(paths, {})
    recorded = {} if paths.live else _recorded_ethtool(paths)
    for nic in nics:
        name = nic["device"]
        ifdir = paths.sys / "class" / "net" / name
        is_netdev = ifdir.exists()
        drv = ethtool_driver_info(name) if (paths.live and is_netdev) else recorded.get(name)
        driver_link = ifdir / "device" / "driver" if is_netdev else None
        if drv is None and driver_link is not None and driver_link.exists():
            drv = {"driver": os.path.basename(os.path.realpath(driver_link)), "version": "", "firmware": "",
                   "bus_info": nic["pci_address"]}
        nic["driver"] = (drv or {}).get("driver", "")
        nic["driver_version"] = (drv or {}).get("version", "")
        nic["firmware"] = (drv or {}).get("firmware", "")
        stats = ifdir / "statistics"
        nic["counters"] = {
            "carrier_changes": read_int(ifdir / "carrier_changes") if is_netdev else None,
            "rx_errors": read_int(stats / "rx_errors") if is_netdev else None,
            "tx_errors": read_int(stats / "tx_errors") if is_netdev else None,
        }
        nic["ib_port"] = None
        if nic["rdma_device"]:
            ib = paths.sys / "class" / "infiniband" / nic["rdma_device"]
            nic["firmware"] = nic["firmware"] or (read_text(ib / "fw_ver") or "")
            port = ib / "ports" / "1"
            phys = read_text(port / "phys_state")  # "5: LinkUp"
            counters = port / "counters"
            nic["ib_port"] = {
                "state": (read_text(port / "state") or "").split(":", 1)[-1].strip(),
                "phys_state": phys.split(":", 1)[-1].strip() if phys else "",
                "rate": read_text(port / "rate") or "",
                "link_layer": read_text(port / "link_layer") or "",
                "link_downed": read_int(counters / "link_downed"),
                "symbol_error": read_int(counters / "symbol_error"),
                "link_error_recovery": read_int(counters / "link_error_recovery"),
                "port_rcv_errors": read_int(counters / "port_rcv_errors"),
            }
    return {"nics": nics, "errors": errors}


# -- host ------------------------------------------------------------------------------------------

STA_UNSYNC = 0x0040
TIME_ERROR = 5


class _Timex(ctypes.Structure):
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
                ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
                ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("_reserved", ctypes.c_int * 11)]


def kernel_clock(paths: HostPaths) -> tuple[dict | None, str | None]:
    """The kernel's clock discipline state (``adjtimex`` with no modes: read only)."""
    if not paths.live:
        text = read_text(host_root(paths) / "adjtimex.json")
        if text is None:
            return None, None
        try:
            return json.loads(text), None
        except ValueError as exc:
            return None, f"clock: adjtimex.json is not JSON ({exc})"
    libc_name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        tx = _Timex(modes=0)
        state = libc.adjtimex(ctypes.byref(tx))
    except (OSError, AttributeError) as exc:
        return None, f"clock: adjtimex unavailable ({exc})"
    if state < 0:
        return None, f"clock: adjtimex failed ({os.strerror(ctypes.get_errno())})"
    return {"state": int(state), "status": int(tx.status), "maxerror_us": int(tx.maxerror),
            "esterror_us": int(tx.esterror), "synchronized": state != TIME_ERROR and not (tx.status & STA_UNSYNC)}, None


def nccl_versions(paths: HostPaths, extra_dirs: tuple[str, ...] = ()) -> list[str]:
    """Versions of ``libnccl.so.2.X.Y`` found in the usual library directories (sorted, unique)."""
    root = host_root(paths)
    found = set()
    for d in (*LIB_DIRS, *extra_dirs):
        base = root / d.lstrip("/")
        for path in glob.glob(str(base / "libnccl.so.2.*")):
            m = re.search(r"libnccl\.so\.(2\.\d+\.\d+)$", path)
            if m:
                found.add(m.group(1))
        # pip's nvidia-nccl-cu12 wheels: the version is in the dist-info directory name
        for dist in glob.glob(str(base / "python3*" / "*-packages" / "nvidia_nccl_cu*-*.dist-info")):
            m = re.search(r"nvidia_nccl_cu\d+-(\d+\.\d+\.\d+)", dist)
            if m:
                found.add(m.group(1))
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".")))


def cuda_toolkit_version(paths: HostPaths) -> str:
    text = read_text(host_root(paths) / "usr" / "local" / "cuda" / "version.json")
    if not text:
        return ""
    try:
        return str(json.loads(text).get("cuda", {}).get("version", ""))
    except (ValueError, AttributeError):
        return ""


def _meminfo(paths: HostPaths) -> dict[str, int]:
    out = {}
    for line in (read_text(paths.proc / "meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0])
    return out


def _thp(paths: HostPaths) -> str:
    text = read_text(paths.sys / "kernel" / "mm" / "transparent_hugepage" / "enabled") or ""
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else ""


def collect_host_facts(paths: HostPaths, gpu_facts: dict, nic_facts: dict, clock_service: Any = None) -> dict:
    """Facts that must agree across a fleet, and the clock sync state."""
    host, errors = host_facts(paths)
    mem = _meminfo(paths)
    clock, clock_error = kernel_clock(paths)
    if clock_error:
        errors.append(clock_error)
    lockstep_clock = None
    if clock_service is not None:
        try:
            lockstep_clock = clock_service()
        except Exception as exc:  # noqa: BLE001 - a clock service failure is a fact, not a crash
            errors.append(f"clock: the agent's clock service failed ({exc})")
    gpus = gpu_facts.get("gpus", [])
    nics = nic_facts.get("nics", [])
    facts = {
        "hostname": host["hostname"],
        "kernel": host["kernel"],
        "os": host["os"],
        "cpu_model": host["cpu_model"],
        "cpu_count": host["cpu_count"],
        "memory_bytes": host["memory_bytes"],
        "gpu_driver": gpu_facts.get("driver_version", ""),
        "cuda_driver": gpu_facts.get("cuda_driver_version", ""),
        "cuda_toolkit": cuda_toolkit_version(paths),
        "nccl": nccl_versions(paths),
        "gpu_models": sorted({g.get("name", "") for g in gpus if g.get("name")}),
        "gpu_count": len(gpus),
        "hugepages_total": mem.get("HugePages_Total"),
        "hugepage_size_kb": mem.get("Hugepagesize"),
        "transparent_hugepages": _thp(paths),
        "nic_drivers": sorted({f"{n['driver']} {n['driver_version']}".strip() for n in nics if n.get("driver")}),
        "nic_firmware": sorted({n["firmware"] for n in nics if n.get("firmware")}),
        "clock": clock,
        "lockstep_clock": lockstep_clock,
    }
    return {"host": facts, "errors": errors}
