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

Recorded values (see ``tests/agent/data/README.md`` for the sources):
``hgx_h100()`` is the ``nvidia-smi -q`` of an 8x H100 80GB HBM3 (SXM5) HGX
server, driver 565.57.01, CUDA 12.7; ``dgx_h100()`` the same eight GPUs at the
PCI addresses of a DGX H100; ``l40s()`` a single L40S PCIe card (no NVLink),
driver 550.127.05, CUDA 12.4.
"""

from __future__ import annotations

import string
import threading
from dataclasses import dataclass, field

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
    ecc_uncorrected_volatile: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    lost: bool = False


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
        for name, value in globals().items():
            if name.startswith("NVML_") or name.startswith("NVMLError_"):
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

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter_type: int) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetTotalEccErrors")
        gpu = self._gpu(handle)
        if gpu.ecc is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED and counter_type == NVML_VOLATILE_ECC:
            return gpu.ecc_uncorrected_volatile
        return 0

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetPowerUsage")
        return self._gpu(handle).power_mw

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
        self._enter("nvmlDeviceGetRemappedRows")
        return self._gpu(handle).remapped_rows

    # -- recorded machines ----------------------------------------------------------

    @classmethod
    def hgx_h100(cls) -> FakeNvml:
        return cls(gpus=[FakeGpu(**g) for g in _H100_RECORD], driver_version="565.57.01", cuda_version=12070)

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

# DGX H100 GPU buses in nvidia-smi order (GPU0..GPU7).
DGX_H100_GPU_BUSES = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")
