"""The per-hardware threshold table of the audit checks: data, with the source of every number.

A Python module rather than a JSON file because the agent's wheel ships Python modules only
(``console/agentdist/build.py``); it is still only data, read by :func:`profile_for`.

Each profile names what a healthy node of that kind shows. ``null``/``None`` means "no
expectation; use what NVML or sysfs reports as the maximum". Checks read NVML's own limits
(temperature thresholds, enforced power limit, maximum PCIe generation) first and fall back to
the profile only where NVML cannot say. ``SOURCES`` cites each value; "GUESS" marks an inference.
"""

from __future__ import annotations

from typing import Any

# Limits that do not depend on the GPU model.
COMMON: dict[str, Any] = {
    # ECC (Azure NHC check_gpu_ecc, conf/nd96isr_h100_v5.conf `check_gpu_ecc 20000000 10000`):
    # any uncorrectable SRAM error fails; more than 10,000 correctable SRAM errors fails; DRAM
    # counts above 20,000,000 fail. Volatile uncorrectable errors fail as in DCGM
    # (DCGM_FR_VOLATILE_DBE_DETECTED, "Detected %d volatile double-bit ECC error(s)").
    "ecc": {
        "volatile_uncorrected_max": 0,
        "sram_uncorrected_max": 0,
        "sram_corrected_max": 10_000,
        "dram_errors_max": 20_000_000,
    },
    # Row remapping (Ampere and newer), Azure NHC check_ecc: pending fails, a remapping failure
    # fails, more than 512 rows remapped for uncorrectable errors fails.
    "row_remap": {"uncorrectable_rows_max": 512},
    # Page retirement (Volta and older), Azure NHC check_SDBE_ecc: 62 or more retired pages with
    # a pending retirement means the retirement table is full.
    "retired_pages": {"total_max": 61},
    # PCIe replays since reset, DCGM pcie plugin default (reference nccl_and_audit.md §4: "replay
    # counter <= 80 default").
    "pcie": {"replays_max": 80},
    # NVLink error counters are totals since the driver loaded: any non-zero value is reported
    # for monitoring (DCGM health watch reports any increase as DCGM_FR_NVLINK_ERROR_THRESHOLD).
    "nvlink": {"replay_max": 0, "recovery_max": 0, "crc_flit_max": 0, "crc_data_max": 0, "ecc_data_max": 0},
    # NIC link counters since boot (Azure NHC check_ib_link_flapping: lost carrier in the log;
    # IB port counters link_downed / symbol_error, `perfquery` semantics).
    "nic": {"link_downed_max": 0, "symbol_error_max": 0, "carrier_changes_max": 2},
    # GPU<->NIC: the NIC of a GPU's rail must be at most this far (nvidia-smi topo -m legend).
    "affinity": {"allowed": ("PIX", "PXB")},
}

PROFILES: dict[str, dict[str, Any]] = {
    "h100-sxm": {
        "description": "NVIDIA H100 SXM5 80GB (HGX/DGX H100)",
        "pci_device_ids": (0x2330,),
        "name_patterns": ("H100 80GB HBM3", "H100 SXM"),
        "gpu": {
            "per_node": 8,
            "pcie_generation": 5,
            "pcie_width": 16,
            "nvlinks": 18,
            "power_limit_w": 700.0,
            "temperature_c": {"gpu_max": 87, "slowdown": 89, "shutdown": 95, "memory_max": 95},
            "fabric_manager": True,
        },
        "nic": {"speed_mbps": 400_000, "pcie_generation": 5, "pcie_width": 16},
        "collective": {
            "all_reduce_intra_node_busbw_gbs": 460.0,
            "per_nic_busbw_gbs": 40.0,
            "ib_write_bw_gbps": 375.0,
        },
    },
    "h200-sxm": {
        "description": "NVIDIA H200 SXM 141GB (HGX/DGX H200)",
        "pci_device_ids": (0x2335,),
        "name_patterns": ("H200",),
        "gpu": {
            "per_node": 8,
            "pcie_generation": 5,
            "pcie_width": 16,
            "nvlinks": 18,
            "power_limit_w": 700.0,
            "temperature_c": {"gpu_max": 87, "slowdown": 89, "shutdown": 95, "memory_max": 95},
            "fabric_manager": True,
        },
        "nic": {"speed_mbps": 400_000, "pcie_generation": 5, "pcie_width": 16},
        "collective": {
            "all_reduce_intra_node_busbw_gbs": 431.0,
            "per_nic_busbw_gbs": 40.0,
            "ib_write_bw_gbps": 360.0,
        },
    },
    "a100-sxm": {
        "description": "NVIDIA A100 SXM4 40GB/80GB (HGX/DGX A100)",
        "pci_device_ids": (0x20B0, 0x20B2),
        "name_patterns": ("A100-SXM4",),
        "gpu": {
            "per_node": 8,
            "pcie_generation": 4,
            "pcie_width": 16,
            "nvlinks": 12,
            "power_limit_w": 400.0,
            "temperature_c": {"gpu_max": 85, "slowdown": 89, "shutdown": 92, "memory_max": 95},
            "fabric_manager": False,  # NVML's GPU fabric info is Hopper and newer
        },
        "nic": {"speed_mbps": 200_000, "pcie_generation": 4, "pcie_width": 16},
        "collective": {
            "all_reduce_intra_node_busbw_gbs": 228.0,
            "per_nic_busbw_gbs": 18.0,
            "ib_write_bw_gbps": 185.0,
        },
    },
}

# No recognised model: only NVML's own limits and the common table apply.
GENERIC: dict[str, Any] = {
    "description": "unrecognised GPU (NVML limits only)",
    "pci_device_ids": (),
    "name_patterns": (),
    "gpu": {"per_node": None, "pcie_generation": None, "pcie_width": None, "nvlinks": None,
            "power_limit_w": None, "temperature_c": {}, "fabric_manager": False},
    "nic": {"speed_mbps": None, "pcie_generation": None, "pcie_width": None},
    "collective": {},
}

SOURCES: dict[str, str] = {
    "h100-sxm.gpu.pcie_generation/pcie_width": "nvidia-smi -q of an 8x H100 80GB HBM3 server (thamada/nvidia-smi "
    "nvsim/H100SXMx8_smi.py): PCIe Generation Max 5, Link Width Max 16x",
    "h100-sxm.gpu.power_limit_w": "same record: Default Power Limit 700.00 W",
    "h100-sxm.gpu.temperature_c": "same record, driver 565 margins: GPU T.Limit Temp 57 C at GPU Current Temp 30 C "
    "(limit 87 C), Slowdown T.Limit -2 C (89 C), Shutdown T.Limit -8 C (95 C); memory_max GUESS: the A100 record's "
    "95 C",
    "h100-sxm.gpu.nvlinks": "18 NVLink 4 links per H100 SXM5 (NV18 in DGX H100 nvidia-smi topo -m)",
    "h100-sxm.gpu.fabric_manager": "same record: Fabric State Completed, Status Success",
    "h100-sxm.nic.speed_mbps": "ConnectX-7 NDR 400 Gb/s; Azure NHC conf/nd96isr_h100_v5.conf check_hw_ib 400",
    "h100-sxm.collective.all_reduce_intra_node_busbw_gbs": "Azure NHC conf/nd96isr_h100_v5.conf "
    "check_nccl_allreduce 460.0 (16G message)",
    "h100-sxm.collective.per_nic_busbw_gbs": "Azure NHC conf/nd96isr_h100_v5.conf check_nccl_allreduce_ib_loopback "
    "40.0; CX-7 NDR reaches 48-49 GB/s (NVIDIA/nccl-tests #267)",
    "h100-sxm.collective.ib_write_bw_gbps": "Azure NHC conf/nd96isr_h100_v5.conf check_ib_bw_gdr 375",
    "h200-sxm.pci_device_ids": "GUESS: 0x2335 for H200 SXM 141GB (pci.ids); the name pattern matches otherwise",
    "h200-sxm.gpu": "GUESS: same PCIe, NVLink and power envelope as H100 SXM5 (700 W, Gen5 x16, 18 NVLink 4)",
    "h200-sxm.nic.speed_mbps": "Azure NHC conf/nd96isr_h200_v5.conf check_hw_ib 400",
    "h200-sxm.collective.all_reduce_intra_node_busbw_gbs": "Azure NHC conf/nd96isr_h200_v5.conf "
    "check_nccl_allreduce 431.0 (16G message)",
    "h200-sxm.collective.ib_write_bw_gbps": "Azure NHC conf/nd96isr_h200_v5.conf check_ib_bw_gdr 360",
    "h200-sxm.collective.per_nic_busbw_gbs": "GUESS: the H100 value (same ConnectX-7 NDR NICs)",
    "a100-sxm.gpu.pcie_generation/pcie_width/temperature_c": "nvidia-smi -q of 4x A100-SXM4-80GB "
    "(thamada/nvidia-smi gls/A100SXMx4_smi.py): PCIe Max 4, 16x; Shutdown 92 C, Slowdown 89 C, Max Operating 85 C, "
    "Memory Max Operating 95 C; Fabric State N/A",
    "a100-sxm.gpu.power_limit_w": "A100 SXM4 TDP 400 W (NVIDIA A100 datasheet); the 500 W SKU of the record above "
    "passes (the limit is a minimum)",
    "a100-sxm.gpu.nvlinks": "12 NVLink 3 links per A100 SXM4 (NV12 in DGX A100 nvidia-smi topo -m)",
    "a100-sxm.nic.speed_mbps": "ConnectX-6 HDR 200 Gb/s; Azure NHC conf/nd96amsr_a100_v4.conf check_hw_ib 200",
    "a100-sxm.collective.all_reduce_intra_node_busbw_gbs": "Azure NHC conf/nd96amsr_a100_v4.conf "
    "check_nccl_allreduce 228.0 (4G message)",
    "a100-sxm.collective.per_nic_busbw_gbs": "Azure NHC conf/nd96amsr_a100_v4.conf "
    "check_nccl_allreduce_ib_loopback 18.0",
    "a100-sxm.collective.ib_write_bw_gbps": "Azure NHC conf/nd96amsr_a100_v4.conf check_ib_bw_gdr 185.0",
    "common.ecc": "Azure NHC customTests/azure_gpu_ecc.nhc (check_ecc) with the thresholds of its ND v5 configs",
    "common.row_remap": "Azure NHC customTests/azure_gpu_ecc.nhc: pending, failure, uncorrectable rows > 512",
    "common.retired_pages": "Azure NHC customTests/azure_gpu_ecc.nhc (check_SDBE_ecc): total >= 62 and pending",
    "common.pcie.replays_max": "DCGM pcie plugin default replay limit (reference nccl_and_audit.md §4)",
    "common.nvlink": "DCGM health watch: any NVLink error counter increase is DCGM_FR_NVLINK_ERROR_THRESHOLD",
    "common.affinity": "nvidia-smi topo -m: GPUs of HGX/DGX servers reach their rail NIC through one or two PCIe "
    "switches (PIX on HGX with Broadcom switches, PXB on DGX H100); NCCL uses GPUDirect RDMA up to PXB by default",
    "collective.busbw": "nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n "
    "(all_gather, reduce_scatter, alltoall), 1 (broadcast, reduce)",
}


def profile_for(pci_device_id: int | None, name: str | None) -> tuple[str, dict[str, Any]]:
    """The profile of a GPU from NVML's PCI device id (``0x233010DE`` or ``0x2330``) or its name."""
    device = None
    if isinstance(pci_device_id, int):
        device = pci_device_id >> 16 if pci_device_id > 0xFFFF else pci_device_id
    for key, profile in PROFILES.items():
        if device is not None and device in profile["pci_device_ids"]:
            return key, profile
    for key, profile in PROFILES.items():
        if name and any(pattern in name for pattern in profile["name_patterns"]):
            return key, profile
    return "generic", GENERIC


def profile(key: str) -> dict[str, Any]:
    """A profile by name (``h100-sxm``, ``h200-sxm``, ``a100-sxm``, ``generic``); KeyError names the known ones."""
    if key == "generic":
        return GENERIC
    try:
        return PROFILES[key]
    except KeyError:
        raise KeyError(f"unknown hardware profile {key!r} (known: {', '.join([*PROFILES, 'generic'])})") from None
