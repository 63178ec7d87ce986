"""What a simulated node says about itself: host facts, inventory, health, telemetry records.

Plausible values for a GPU server (docs/agent-protocol.md), deterministic per host so reruns
describe the same machine, and cheap to build (thousands of agents share one process).
"""

from __future__ import annotations

import hashlib
import random
import time
from datetime import datetime, timezone

AGENT_VERSION = "0.1.0-sim"
GPU_NAME = "NVIDIA H100 80GB HBM3"
GPU_MEMORY = 85520809984
MEMORY_BYTES = 2164175564800


def machine_id(prefix: str, index: int) -> str:
    """A stable 32-hex machine-id per (prefix, index): a rerun re-enrolls the same nodes."""
    return hashlib.md5(f"lockstep-fleet:{prefix}:{index}".encode(), usedforsecurity=False).hexdigest()


def hostname(prefix: str, index: int) -> str:
    return f"{prefix}{index:05d}"


def host_facts(name: str, mid: str) -> dict:
    return {
        "hostname": name, "machine_id": mid, "boot_id": mid[::-1],
        "kernel": "6.1.0-18-amd64", "os": "Debian GNU/Linux 12 (bookworm)", "arch": "x86_64",
        "cpu_model": "AMD EPYC 9654", "cpu_count": 192, "memory_bytes": MEMORY_BYTES,
        "agent_version": AGENT_VERSION,
    }


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


def inventory(name: str, mid: str, gpus: int, rails: int) -> dict:
    """A `lockstep.inventory/v1` document: `gpus` GPUs, one RDMA NIC per rail and a management NIC."""
    seed = int(mid[:8], 16)
    nics = [
        {"device": f"nic{r}", "kind": "ethernet", "mac": f"02:{(seed >> 8) & 0xff:02x}:{seed & 0xff:02x}:00:{r:02x}:01",
         "guid": "", "rdma_device": f"mlx5_{r}", "pci_address": f"0000:{0x19 + 0x10 * r:02x}:00.0",
         "numa_node": 0 if r < max(rails, 1) / 2 else 1, "speed_mbps": 400000, "mtu": 9000, "link_state": "up",
         "addresses": [f"172.16.{r}.{seed % 250 + 2}/24"]}
        for r in range(rails)
    ]
    nics.append({"device": "mgmt0", "kind": "ethernet", "mac": f"02:{(seed >> 8) & 0xff:02x}:{seed & 0xff:02x}:ff:00:01",
                 "guid": "", "rdma_device": "", "pci_address": "0000:01:00.0", "numa_node": 0, "speed_mbps": 25000,
                 "mtu": 1500, "link_state": "up", "addresses": [f"10.200.{(seed >> 8) % 250}.{seed % 250 + 2}/16"]})
    gpu_list = [
        {"index": i, "name": GPU_NAME, "uuid": f"GPU-{mid[:8]}-{mid[8:12]}-{i:04x}-{mid[12:16]}-{mid[16:28]}",
         "pci_bus_id": f"0000:{0x18 + 0x10 * i:02x}:00.0", "memory_bytes": GPU_MEMORY,
         "driver_version": "550.54.15", "cuda_version": "12.4", "ecc_enabled": True,
         "numa_node": 0 if i < gpus / 2 else 1,
         "nvlinks": [{"link": k, "active": True} for k in range(4)]}
        for i in range(gpus)
    ]
    affinity = [
        {"gpu": g["uuid"], "nic": f"nic{g['index'] % rails}", "relation": "PIX" if g["index"] < rails else "NODE"}
        for g in gpu_list
    ] if rails else []
    return {
        "format": "lockstep.inventory/v1",
        "collected_at": _now_iso(),
        "host": {k: v for k, v in host_facts(name, mid).items() if k != "agent_version"},
        "gpus": gpu_list,
        "nics": nics,
        "affinity": affinity,
        "errors": [],
    }


def health(rng: random.Random, gpus: int, rails: int, uptime_s: float) -> dict:
    """A `node.health` result."""
    return {
        "load1": round(rng.uniform(0.1, 4.0), 2),
        "memory_available_bytes": int(MEMORY_BYTES * rng.uniform(0.3, 0.9)),
        "disk_free_bytes": int(3.5e12 * rng.uniform(0.2, 0.8)),
        "uptime_s": round(uptime_s, 1),
        "gpus": [{"index": i, "temperature_c": rng.randint(32, 68), "ecc_uncorrected": 0,
                  "utilization_pct": rng.randint(0, 100)} for i in range(gpus)],
        "nics": [{"device": f"nic{r}", "link_state": "up", "rx_errors": 0, "tx_errors": 0} for r in range(rails)]
        + [{"device": "mgmt0", "link_state": "up", "rx_errors": 0, "tx_errors": 0}],
        "ok": True,
        "problems": [],
    }


def telemetry_records(rng: random.Random, count: int, rails: int) -> list[dict]:
    """`count` records of kinds the console knows (console/telemetry/builtin.py): a short host
    health summary, and NCCL path states the agent forwards from the plugin (`event.nccl.path_state`)."""
    now = time.time()
    records = []
    for k in range(count):
        if k % 4 == 0:
            records.append({"kind": "node.health", "ts": now,
                            "data": {"load1": round(rng.uniform(0.1, 4.0), 2),
                                     "memory_available_bytes": int(MEMORY_BYTES * rng.uniform(0.3, 0.9)),
                                     "ok": True, "problems": []}})
        else:
            records.append({"kind": "event.nccl.path_state", "ts": now,
                            "data": {"nic": f"nic{k % max(rails, 1)}", "state": "up",
                                     "rx_bytes": rng.randint(0, 1 << 40), "tx_bytes": rng.randint(0, 1 << 40),
                                     "errors": 0}})
    return records
