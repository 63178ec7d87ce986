"""Inventory discovery: the ``lockstep.inventory/v1`` document (protocol §6).

    from agent.inventory import collect
    doc = collect()                                   # this host, real pynvml
    doc = collect(HostPaths.from_sysfs_root("tests/agent/data/dgx-h100/sys"), nvml=fake)

Nothing here raises for a missing piece: what cannot be read is left empty and
explained in ``errors``, so a partial inventory is still useful.
"""

from __future__ import annotations

import time
from typing import Any

from agent.inventory.addresses import from_ip_json, live_addresses
from agent.inventory.gpus import collect_gpus, load_nvml
from agent.inventory.host import host_facts
from agent.inventory.nics import collect_nics
from agent.inventory.paths import HostPaths, read_text
from agent.inventory.pcie import chain_of, pci_device_dir, relation

FORMAT = "lockstep.inventory/v1"
_DEFAULT = object()


def iso_now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def addresses_for(paths: HostPaths) -> tuple[dict[str, list[str]], list[str]]:
    if paths.ip_addr_json is None:
        return live_addresses()
    text = read_text(paths.ip_addr_json)
    if not text:
        return {}, []
    try:
        return from_ip_json(text), []
    except ValueError as exc:
        return {}, [f"addresses: {paths.ip_addr_json} is not `ip -j addr` output: {exc}"]


def affinity(paths: HostPaths, gpus: list[dict], nics: list[dict]) -> list[dict]:
    """GPU-NIC pairs closer than SYS, with their ``nvidia-smi topo -m`` relation."""
    pairs = []
    nic_chains = []
    for nic in nics:
        if nic["pci_address"]:
            chain = chain_of(paths, pci_device_dir(paths, nic["pci_address"]))
            if chain:
                nic_chains.append((nic, chain))
    for gpu in gpus:
        if not gpu.get("pci_bus_id"):
            continue
        gchain = chain_of(paths, pci_device_dir(paths, gpu["pci_bus_id"]))
        if not gchain:
            continue
        for nic, nchain in nic_chains:
            rel = relation(gchain, gpu.get("numa_node"), nchain, nic.get("numa_node"))
            if rel != "SYS":
                pairs.append({"gpu": gpu["uuid"], "nic": nic["device"], "relation": rel})
    return pairs


def collect(
    paths: HostPaths | None = None,
    nvml: Any = _DEFAULT,
    hostname: str | None = None,
    machine_id: str | None = None,
) -> dict:
    """The inventory of the host described by ``paths`` (default: this host).

    ``nvml``: a pynvml-compatible module; by default the real ``pynvml`` when it
    is installed; ``None`` means "no NVML".
    """
    paths = paths or HostPaths()
    reason = None
    if nvml is _DEFAULT:
        nvml, reason = load_nvml()
    host, errors = host_facts(paths, hostname=hostname, machine_id=machine_id)
    gpus, gpu_errors = collect_gpus(nvml, paths, reason)
    addresses, addr_errors = addresses_for(paths)
    nics, nic_errors = collect_nics(paths, addresses)
    return {
        "format": FORMAT,
        "collected_at": iso_now(),
        "host": host,
        "gpus": gpus,
        "nics": nics,
        "affinity": affinity(paths, gpus, nics),
        "errors": errors + gpu_errors + addr_errors + nic_errors,
    }


def fingerprint(document: dict) -> str:
    """A stable digest of what matters (everything but ``collected_at``): send again when it changes."""
    import hashlib
    import json

    body = {k: v for k, v in document.items() if k != "collected_at"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


__all__ = ["FORMAT", "HostPaths", "collect", "fingerprint", "iso_now"]
