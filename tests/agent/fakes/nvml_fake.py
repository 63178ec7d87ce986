"""A FAKE of the ``pynvml`` module (nvidia-ml-py 13.x), for hosts without an NVIDIA GPU.

It mimics the functions the agent calls, with pynvml's signatures, return
shapes and error behaviour:

- errors are ``NVMLError(value)`` instances of per-code subclasses named like
  pynvml's (``NVMLError_NotSupported``, ``NVMLError_LibraryNotFound`` ...), with
  pynvml's messages (``str(e) == "NVML Shared Library Not Found"``);
- ``nvmlInit`` raises ``NVML_ERROR_LIBRARY_NOT_FOUND`` when there is no
  ``libnvidia-ml.so.1`` and ``NVML_ERROR_DRIVER_NOT_LOADED`` without a driver;
  every other call before ``nvmlInit`` (or after the last ``nvmlShutdown``)
  raises ``NVML_ERROR_UNINITIALIZED``; init/shutdown are reference-counted;
- ``nvmlDeviceGetHandleByIndex`` out of range: ``NVML_ERROR_INVALID_ARGUMENT``;
- ``nvmlDeviceGetNvLinkState``: ``NVML_ERROR_NOT_SUPPORTED`` on PCIe cards
  without NVLink, ``NVML_ERROR_INVALID_ARGUMENT`` for a link index the GPU does
  not have ("device or link is invalid", NVML reference);
- ``nvmlDeviceGetEccMode`` / ECC counters: ``NVML_ERROR_NOT_SUPPORTED`` on GPUs
  without ECC;
- a GPU marked lost raises ``NVML_ERROR_GPU_IS_LOST`` on every device call;
- ``nvmlDeviceGetPciInfo().busId`` is a ``str`` like ``"00000000:18:00.0"``
  (pynvml decodes char arrays), ``nvmlDeviceGetMemoryInfo().total`` is bytes,
  ``nvmlSystemGetCudaDriverVersion()`` an int like ``12070``, power in mW.

- the audit's calls (``agent/audit/collect.py``) follow the NVML reference: ECC counters by
  type/counter/location (``NOT_SUPPORTED`` without ECC or with ECC disabled, and for locations
  other than DRAM and SRAM), retired pages ``NOT_SUPPORTED`` on row-remapping GPUs (Ampere+,
  nvidia-smi shows "N/A") and row remapping ``NOT_SUPPORTED`` on older ones, a clocks-event
  reasons bit mask, absolute temperature thresholds, power in mW, per-link NVLink error
  counters (``INVALID_ARGUMENT`` past the last link or counter), the GPU fabric state filled
  into a ``c_nvmlGpuFabricInfo_t``, per-field returns in ``nvmlDeviceGetFieldValues``, and
  Xid events delivered once to each event set that registered for them
  (``nvmlEventSetWait_v2`` raises ``NVML_ERROR_TIMEOUT`` when none is left).

Defects (``FakeGpu.with_defect``, ``DEFECTS``): ``ecc`` (uncorrectable SRAM parity error),
``remap-pending`` (a DRAM double-bit error whose row remap waits for a reset),
``remap-failure``, ``pcie-gen4-x8``, ``xid`` (Xid 74 with NVLink recovery errors),
``throttle-thermal`` (HW thermal slowdown at 91 C), ``power-brake``, ``nvlink-down``,
``fabric-not-started``, ``persistence-off``, ``power-capped``, ``lost``.
``FakeNvml.hgx_h100_defects()`` is the recorded HGX H100 with one defect on each of GPUs 1-5.

Recorded values (see ``tests/agent/data/README.md`` for the sources):
``hgx_h100()`` is the ``nvidia-smi -q`` of an 8x H100 80GB HBM3 (SXM5) HGX
server, driver 565.57.01, CUDA 12.7; ``dgx_h100()`` the same eight GPUs at the
PCI addresses of a DGX H100; ``l40s()`` a single L40S PCIe card (no NVLink),
driver 550.127.05, CUDA 12.4.
"""

from __future__ import annotations

import string
import threading
from dataclasses import dataclass, field, replace

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_MEMORY = 20
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_LOCATION_DRAM = 2
NVML_MEMORY_LOCATION_SRAM = 7
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
NVML_TEMPERATURE_THRESHOLD_COUNT = 8
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_NVLINK_ERROR_DL_ECC_DATA = 4
NVML_NVLINK_ERROR_COUNT = 5
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3

# clocks event reasons (pynvml nvmlClocksEventReason*)
nvmlClocksEventReasonGpuIdle = 0x1  # noqa: N816 - pynvml's names
nvmlClocksEventReasonApplicationsClocksSetting = 0x2  # noqa: N816
nvmlClocksEventReasonSwPowerCap = 0x4  # noqa: N816
nvmlClocksEventReasonHwSlowdown = 0x8  # noqa: N816
nvmlClocksEventReasonSyncBoost = 0x10  # noqa: N816
nvmlClocksEventReasonSwThermalSlowdown = 0x20  # noqa: N816
nvmlClocksEventReasonHwThermalSlowdown = 0x40  # noqa: N816
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80  # noqa: N816
nvmlEventTypeXidCriticalError = 0x8  # noqa: N816

# pynvml's NVMLError._errcode_to_string
_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_MEMORY: "Insufficient Memory",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """Like pynvml.NVMLError: ``NVMLError(code)`` builds the per-code subclass."""

    _valClassMapping: dict[int, type] = {}  # noqa: N815 - pynvml's name

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes() -> dict[str, type]:
    classes = {}
    for name, value in list(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        cls = type(class_name, (NVMLError,), {})
        NVMLError._valClassMapping[value] = cls
        classes[class_name] = cls
    return classes


_ERROR_CLASSES = _make_error_classes()
globals().update(_ERROR_CLASSES)


@dataclass
class FakeGpu:
    name: str
    uuid: str
    bus_id: str  # NVML spelling: 00000000:18:00.0
    memory_mib: int
    pci_device_id: int
    ecc: tuple[int, int] | None = (1, 1)  # None: ECC not supported
    nvlinks: int | None = 18  # None: no NVLink (PCIe card)
    nvlinks_down: frozenset[int] = frozenset()
    temperature_c: int = 30
    power_mw: int = 100000
    # ECC counts keyed "<dram|sram>.<corrected|uncorrected>.<volatile|aggregate>" (absent: 0)
    ecc_errors: dict[str, int] = field(default_factory=dict)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failure; None: pre-Ampere
    remap_histogram: tuple[int, int, int, int, int] = (2560, 0, 0, 0, 0)  # max, high, partial, low, none banks
    retired_pages: dict | None = None  # pre-Ampere only: {"sbe": [addr], "dbe": [addr], "pending": bool}
    persistence_mode: int = 1
    clocks_event_reasons: int = 0x1  # idle, as recorded
    memory_temperature_c: int | None = 36
    temperature_thresholds: dict[int, int] = field(default_factory=lambda: {0: 95, 1: 89, 2: 95, 3: 87})
    power_limit_mw: int = 700000
    default_power_limit_mw: int = 700000
    pcie_generation: tuple[int, int, int] = (5, 5, 5)  # current, max (device and host), GPU max
    pcie_width: tuple[int, int] = (16, 16)  # current, max
    pcie_replays: int = 0
    nvlink_errors: dict[int, dict[int, int]] = field(default_factory=dict)  # link -> {counter: count}
    fabric: tuple[int, int] | None = (3, 0)  # (NVML_GPU_FABRIC_STATE_*, nvmlReturn status); None: no fabric
    xid_events: tuple[int, ...] = ()  # Xids raised while an event set listens
    lost: bool = False

    def with_defect(self, kind: str) -> FakeGpu:
        """This GPU with one defect, as NVML reports it (see DEFECTS)."""
        try:
            return replace(self, **DEFECTS[kind](self))
        except KeyError:
            raise KeyError(f"unknown GPU defect {kind!r} (known: {', '.join(DEFECTS)})") from None


def _ecc_plus(gpu: FakeGpu, **counts: int) -> dict[str, int]:
    merged = dict(gpu.ecc_errors)
    for key, n in counts.items():
        k = key.replace("_", ".")
        merged[k] = merged.get(k, 0) + n
    return merged


DEFECTS = {
    # an uncorrectable SRAM parity error: counted, no row to remap
    "ecc": lambda g: {"ecc_errors": _ecc_plus(g, sram_uncorrected_volatile=1, sram_uncorrected_aggregate=1,
                                              sram_corrected_volatile=3, sram_corrected_aggregate=12000)},
    # a DRAM double-bit error: counted, its row remap pending until the GPU is reset
    "remap-pending": lambda g: {"ecc_errors": _ecc_plus(g, dram_uncorrected_volatile=1, dram_uncorrected_aggregate=1),
                                "remapped_rows": (0, 1, 1, 0)},
    "remap-failure": lambda g: {"ecc_errors": _ecc_plus(g, dram_uncorrected_aggregate=9),
                                "remapped_rows": (0, 8, 0, 1), "remap_histogram": (2550, 6, 2, 1, 1)},
    "pcie-gen4-x8": lambda g: {"pcie_generation": (4, g.pcie_generation[1], g.pcie_generation[2]),
                               "pcie_width": (8, g.pcie_width[1]), "clocks_event_reasons": 0x0},
    "xid": lambda g: {"xid_events": (74,), "nvlink_errors": {0: {NVML_NVLINK_ERROR_DL_RECOVERY: 1,
                                                                NVML_NVLINK_ERROR_DL_REPLAY: 12}}},
    "throttle-thermal": lambda g: {"clocks_event_reasons": 0x8 | 0x40 | 0x20, "temperature_c": 91,
                                   "memory_temperature_c": 88},
    "power-brake": lambda g: {"clocks_event_reasons": 0x8 | 0x80},
    "nvlink-down": lambda g: {"nvlinks_down": frozenset({3})},
    "fabric-not-started": lambda g: {"fabric": (NVML_GPU_FABRIC_STATE_NOT_STARTED, 0)},
    "persistence-off": lambda g: {"persistence_mode": 0},
    "power-capped": lambda g: {"power_limit_mw": 500000},
    "lost": lambda g: {"lost": True},
}


@dataclass
class _PciInfo:
    busId: str  # noqa: N815 - pynvml field names
    busIdLegacy: str  # noqa: N815
    domain: int
    bus: int
    device: int
    pciDeviceId: int  # noqa: N815


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass
class _Histogram:  # c_nvmlRowRemapperHistogramValues
    max: int
    high: int
    partial: int
    low: int
    none: int


@dataclass
class _Value:  # c_nvmlValue_t (the members the audit reads)
    uiVal: int = 0  # noqa: N815
    ullVal: int = 0  # noqa: N815


@dataclass
class _FieldValue:  # c_nvmlFieldValue_t
    fieldId: int  # noqa: N815
    nvmlReturn: int  # noqa: N815
    value: _Value


class c_nvmlGpuFabricInfo_t:  # noqa: N801 - pynvml's name; filled by nvmlDeviceGetGpuFabricInfo
    def __init__(self) -> None:
        self.clusterUuid = bytes(16)  # noqa: N815
        self.status = NVML_SUCCESS
        self.cliqueId = 0  # noqa: N815
        self.state = NVML_GPU_FABRIC_STATE_NOT_SUPPORTED


@dataclass
class _EventData:  # c_nvmlEventData_t
    device: _Handle
    eventType: int  # noqa: N815
    eventData: int  # noqa: N815
    gpuInstanceId: int = 0xFFFFFFFF  # noqa: N815
    computeInstanceId: int = 0xFFFFFFFF  # noqa: N815


@dataclass
class _EventSet:
    pending: list[_EventData] = field(default_factory=list)
    freed: bool = False


@dataclass
class FakeNvml:
    """Use as the ``nvml`` module: ``collect(paths, nvml=FakeNvml.hgx_h100())``."""

    gpus: list[FakeGpu] = field(default_factory=list)
    driver_version: str = "565.57.01"
    cuda_version: int = 12070
    library_present: bool = True
    driver_loaded: bool = True
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._refcount = 0
        self._lock = threading.Lock()
        self.NVMLError = NVMLError
        self.c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
        for name, value in globals().items():
            if name.startswith(("NVML_", "NVMLError_", "nvmlClocksEventReason", "nvmlEventType")):
                setattr(self, name, value)

    # -- helpers --------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if self._refcount == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: _Handle) -> FakeGpu:
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return gpu

    @property
    def initialized(self) -> bool:
        return self._refcount > 0

    # -- library --------------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self.calls.append("nvmlInit")
        if not self.library_present:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if not self.driver_loaded:
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        with self._lock:
            self._refcount += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.calls.append("nvmlShutdown")
        with self._lock:
            if self._refcount == 0:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    # -- devices --------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex")
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetName")
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetUUID")
        return self._gpu(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _PciInfo:  # noqa: N802
        self._enter("nvmlDeviceGetPciInfo")
        gpu = self._gpu(handle)
        domain, bus, rest = gpu.bus_id.split(":")
        return _PciInfo(
            busId=gpu.bus_id,
            busIdLegacy=f"{int(domain, 16):04X}:{bus}:{rest}",
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=int(rest.split(".")[0], 16),
            pciDeviceId=gpu.pci_device_id,
        )

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Memory:  # noqa: N802
        self._enter("nvmlDeviceGetMemoryInfo")
        total = self._gpu(handle).memory_mib * 1024 * 1024
        return _Memory(total=total, free=total - 1024 * 1024, used=1024 * 1024)

    def nvmlDeviceGetEccMode(self, handle: _Handle) -> list[int]:  # noqa: N802
        self._enter("nvmlDeviceGetEccMode")
        gpu = self._gpu(handle)
        if gpu.ecc is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.ecc[0], gpu.ecc[1]]

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkState")
        gpu = self._gpu(handle)
        if gpu.nvlinks is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < min(gpu.nvlinks, NVML_NVLINK_MAX_LINKS):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_DISABLED if link in gpu.nvlinks_down else NVML_FEATURE_ENABLED

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu(handle).temperature_c

    @staticmethod
    def _ecc_key(error_type: int, counter_type: int) -> str:
        if error_type not in (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED) or \
                counter_type not in (NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        etype = "uncorrected" if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
        return f"{etype}.{'volatile' if counter_type == NVML_VOLATILE_ECC else 'aggregate'}"

    def _ecc_gpu(self, handle: _Handle) -> FakeGpu:
        gpu = self._gpu(handle)
        if gpu.ecc is None or gpu.ecc[0] != NVML_FEATURE_ENABLED:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # no ECC, or ECC disabled: nvidia-smi shows N/A
        return gpu

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetTotalEccErrors")
        gpu = self._ecc_gpu(handle)
        key = self._ecc_key(error_type, counter_type)
        return sum(gpu.ecc_errors.get(f"{loc}.{key}", 0) for loc in ("dram", "sram"))

    def nvmlDeviceGetMemoryErrorCounter(self, handle: _Handle, error_type: int, counter_type: int,  # noqa: N802
                                        location: int) -> int:
        self._enter("nvmlDeviceGetMemoryErrorCounter")
        gpu = self._ecc_gpu(handle)
        key = self._ecc_key(error_type, counter_type)
        names = {NVML_MEMORY_LOCATION_DRAM: "dram", NVML_MEMORY_LOCATION_SRAM: "sram"}
        if location not in names:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.ecc_errors.get(f"{names[location]}.{key}", 0)

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetPersistenceMode")
        return self._gpu(handle).persistence_mode

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, cause: int) -> list[int]:  # noqa: N802
        self._enter("nvmlDeviceGetRetiredPages")
        gpu = self._gpu(handle)
        if gpu.retired_pages is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            return list(gpu.retired_pages.get("sbe", []))
        if cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            return list(gpu.retired_pages.get("dbe", []))
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetRetiredPagesPendingStatus")
        gpu = self._gpu(handle)
        if gpu.retired_pages is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if gpu.retired_pages.get("pending") else NVML_FEATURE_DISABLED

    def nvmlDeviceGetRowRemapperHistogram(self, handle: _Handle) -> _Histogram:  # noqa: N802
        self._enter("nvmlDeviceGetRowRemapperHistogram")
        gpu = self._gpu(handle)
        if gpu.remapped_rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Histogram(*gpu.remap_histogram)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCurrentClocksEventReasons")
        return self._gpu(handle).clocks_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:  # noqa: N802 - the old name
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons")
        return self._gpu(handle).clocks_event_reasons

    def nvmlDeviceGetTemperatureThreshold(self, handle: _Handle, threshold: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetTemperatureThreshold")
        gpu = self._gpu(handle)
        if not 0 <= threshold < NVML_TEMPERATURE_THRESHOLD_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if threshold not in gpu.temperature_thresholds:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.temperature_thresholds[threshold]

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list[int]) -> list[_FieldValue]:  # noqa: N802
        self._enter("nvmlDeviceGetFieldValues")
        gpu = self._gpu(handle)
        out = []
        for fid in field_ids:
            if fid == NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temperature_c is not None:
                out.append(_FieldValue(fid, NVML_SUCCESS, _Value(uiVal=gpu.memory_temperature_c)))
            else:  # each field carries its own return code; the call itself succeeds
                out.append(_FieldValue(fid, NVML_ERROR_NOT_SUPPORTED, _Value()))
        return out

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetEnforcedPowerLimit")
        return self._gpu(handle).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetPowerManagementDefaultLimit")
        return self._gpu(handle).default_power_limit_mw

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration")
        return self._gpu(handle).pcie_generation[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetMaxPcieLinkGeneration")
        return self._gpu(handle).pcie_generation[1]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetGpuMaxPcieLinkGeneration")
        return self._gpu(handle).pcie_generation[2]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCurrPcieLinkWidth")
        return self._gpu(handle).pcie_width[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetMaxPcieLinkWidth")
        return self._gpu(handle).pcie_width[1]

    def nvmlDeviceGetPcieReplayCounter(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetPcieReplayCounter")
        return self._gpu(handle).pcie_replays

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: _Handle, link: int, counter: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNvLinkErrorCounter")
        gpu = self._gpu(handle)
        if gpu.nvlinks is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < min(gpu.nvlinks, NVML_NVLINK_MAX_LINKS) or not 0 <= counter < NVML_NVLINK_ERROR_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlink_errors.get(link, {}).get(counter, 0)

    def nvmlDeviceGetGpuFabricInfo(self, handle: _Handle, info: c_nvmlGpuFabricInfo_t) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetGpuFabricInfo")
        gpu = self._gpu(handle)
        if gpu.fabric is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        target = getattr(info, "_obj", info)  # a ctypes byref() or the structure itself
        target.state, target.status = gpu.fabric
        return NVML_SUCCESS

    # -- events ---------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:  # noqa: N802
        self._enter("nvmlEventSetCreate")
        return _EventSet()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: _EventSet) -> None:  # noqa: N802
        self._enter("nvmlDeviceRegisterEvents")
        gpu = self._gpu(handle)
        if event_types & nvmlEventTypeXidCriticalError:
            event_set.pending += [_EventData(handle, nvmlEventTypeXidCriticalError, xid) for xid in gpu.xid_events]

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> _EventData:  # noqa: N802
        self._enter("nvmlEventSetWait_v2")
        if event_set.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not event_set.pending:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return event_set.pending.pop(0)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:  # noqa: N802
        self._enter("nvmlEventSetFree")
        event_set.freed = True

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetPowerUsage")
        return self._gpu(handle).power_mw

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
        self._enter("nvmlDeviceGetRemappedRows")
        rows = self._gpu(handle).remapped_rows
        if rows is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return rows

    # -- recorded machines ----------------------------------------------------------

    @classmethod
    def hgx_h100(cls) -> FakeNvml:
        return cls(gpus=[FakeGpu(**g) for g in _H100_RECORD], driver_version="565.57.01", cuda_version=12070)

    @classmethod
    def hgx_h100_defects(cls) -> FakeNvml:
        """The recorded HGX H100 with one defect each on GPUs 1-5 (0, 6 and 7 healthy)."""
        fake = cls.hgx_h100()
        for index, kind in HGX_H100_DEFECTS.items():
            fake.gpus[index] = fake.gpus[index].with_defect(kind)
        return fake

    @classmethod
    def from_spec(cls, spec: dict) -> FakeNvml:
        """A fake from a JSON-able spec: ``{"machine": "hgx_h100", "defects": {"3": "pcie-gen4-x8"}}``
        (used by the testbed's NVML shim, ``testbed/nvmlshim/``)."""
        machines = {"hgx_h100": cls.hgx_h100, "dgx_h100": cls.dgx_h100, "l40s": cls.l40s}
        machine = spec.get("machine", "hgx_h100")
        if machine not in machines:
            raise ValueError(f"machine {machine!r}: use one of {', '.join(machines)}")
        fake = machines[machine]()
        for key, kinds in (spec.get("defects") or {}).items():
            index = int(key)
            if not 0 <= index < len(fake.gpus):
                raise ValueError(f"defects: GPU {index} does not exist on {machine} ({len(fake.gpus)} GPUs)")
            for kind in [kinds] if isinstance(kinds, str) else kinds:
                fake.gpus[index] = fake.gpus[index].with_defect(kind)
        return fake

    @classmethod
    def dgx_h100(cls) -> FakeNvml:
        gpus = []
        for g, bus in zip(_H100_RECORD, DGX_H100_GPU_BUSES, strict=True):
            gpus.append(FakeGpu(**{**g, "bus_id": f"00000000:{bus}:00.0"}))
        return cls(gpus=gpus, driver_version="565.57.01", cuda_version=12070)

    @classmethod
    def l40s(cls) -> FakeNvml:
        gpu = FakeGpu(
            name="NVIDIA L40S",
            uuid="GPU-1db6b1cf-de5e-b497-caca-1a027578d587",
            bus_id="00000000:A1:00.0",
            memory_mib=46068,
            pci_device_id=0x26B910DE,
            ecc=(1, 1),
            nvlinks=None,
            temperature_c=30,
            power_mw=33440,
            fabric=None,  # no NVSwitch
            pcie_generation=(4, 4, 4),  # L40S: PCIe Gen4 x16
            power_limit_mw=350000,
            default_power_limit_mw=350000,
        )
        return cls(gpus=[gpu], driver_version="550.127.05", cuda_version=12040)

    @classmethod
    def without_library(cls) -> FakeNvml:
        return cls(library_present=False)

    @classmethod
    def without_driver(cls) -> FakeNvml:
        return cls(driver_loaded=False)


# nvidia-smi -q of an 8x H100 SXM5 HGX server (thamada/nvidia-smi, nvsim/H100SXMx8_smi.py):
# product name, GPU UUID, bus id, FB memory total, device id, GPU current temp, power draw.
_H100_RECORD = [
    {"uuid": "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1", "bus_id": "00000000:18:00.0", "temperature_c": 30, "power_mw": 100890},
    {"uuid": "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd", "bus_id": "00000000:2A:00.0", "temperature_c": 30, "power_mw": 82810},
    {"uuid": "GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f", "bus_id": "00000000:3A:00.0", "temperature_c": 31, "power_mw": 85980},
    {"uuid": "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14", "bus_id": "00000000:5D:00.0", "temperature_c": 29, "power_mw": 85480},
    {"uuid": "GPU-72be6e5d-3c1b-0d37-98ac-d3ef159f2589", "bus_id": "00000000:9A:00.0", "temperature_c": 28, "power_mw": 84940},
    {"uuid": "GPU-52378fbc-3124-3895-13b6-1dd179563e0f", "bus_id": "00000000:AB:00.0", "temperature_c": 30, "power_mw": 85270},
    {"uuid": "GPU-83a5aebb-b71c-c570-aa83-185e1233fe97", "bus_id": "00000000:BA:00.0", "temperature_c": 29, "power_mw": 86050},
    {"uuid": "GPU-33135771-a848-ece1-b61e-489e221d663c", "bus_id": "00000000:DB:00.0", "temperature_c": 29, "power_mw": 75090},
]
for _g in _H100_RECORD:
    _g.update(name="NVIDIA H100 80GB HBM3", memory_mib=81559, pci_device_id=0x233010DE, ecc=(1, 1), nvlinks=18)
_H100_RECORD[0]["pcie_replays"] = 7  # "Replays Since Reset : 7" on GPU 0 of the record, 0 on the others

# The defects of FakeNvml.hgx_h100_defects() (and of the recorded tree hgx-h100-defects).
HGX_H100_DEFECTS = {1: "ecc", 2: "remap-pending", 3: "pcie-gen4-x8", 4: "xid", 5: "throttle-thermal"}

# DGX H100 GPU buses in nvidia-smi order (GPU0..GPU7).
DGX_H100_GPU_BUSES = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")
