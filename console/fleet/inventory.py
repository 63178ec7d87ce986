"""Validate a `lockstep.inventory/v1` document and apply it to a node's GPUs and NICs."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.core.errors import Invalid
from console.core.limits import check_columns
from console.core.models import Health
from console.fleet.events import node_changed
from console.fleet.models import Gpu, Nic, Node

FORMAT = "lockstep.inventory/v1"
RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first
LINK_HEALTH = {"up": Health.OK, "down": Health.DOWN}
HOST_FACTS = ("hostname", "machine_id", "boot_id", "kernel", "os", "arch", "cpu_model", "cpu_count",
              "memory_bytes", "agent_version")


class InventoryError(Invalid):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}", field=field, problem=message)


def _expect(value, kind, field: str, what: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InventoryError(field, f"must be {what}, got {value!r}")
    return value


def validate_inventory(doc) -> dict:
    """Check the shape the console relies on; raise InventoryError naming the first bad field."""
    _expect(doc, dict, "inventory", "an object")
    if doc.get("format") != FORMAT:
        raise InventoryError("format", f"expected {FORMAT!r}, got {doc.get('format')!r}")
    _expect(doc.get("host", {}), dict, "host", "an object")
    seen_gpus: set[int] = set()
    for i, gpu in enumerate(_expect(doc.get("gpus", []), list, "gpus", "a list")):
        _expect(gpu, dict, f"gpus[{i}]", "an object")
        index = _expect(gpu.get("index"), int, f"gpus[{i}].index", "an integer")
        if index < 0 or index in seen_gpus:
            raise InventoryError(f"gpus[{i}].index", f"{index} is negative or repeated")
        seen_gpus.add(index)
        if "memory_bytes" in gpu and gpu["memory_bytes"] is not None:
            _expect(gpu["memory_bytes"], int, f"gpus[{i}].memory_bytes", "an integer")
    seen_nics: set[str] = set()
    for i, nic in enumerate(_expect(doc.get("nics", []), list, "nics", "a list")):
        _expect(nic, dict, f"nics[{i}]", "an object")
        device = _expect(nic.get("device"), str, f"nics[{i}].device", "a string")
        if not device or len(device) > 64 or device in seen_nics:
            raise InventoryError(f"nics[{i}].device", f"{device!r} is empty, too long or repeated")
        seen_nics.add(device)
        for key in ("speed_mbps", "mtu", "numa_node"):
            if nic.get(key) is not None:
                _expect(nic[key], int, f"nics[{i}].{key}", "an integer")
        _expect(nic.get("addresses", []), list, f"nics[{i}].addresses", "a list")
    for i, pair in enumerate(_expect(doc.get("affinity", []), list, "affinity", "a list")):
        _expect(pair, dict, f"affinity[{i}]", "an object")
        if pair.get("relation") not in RELATIONS:
            raise InventoryError(f"affinity[{i}].relation", f"must be one of {', '.join(RELATIONS)}")
    _collected_at(doc)
    check_columns(_column_checks(doc))
    return doc


def _column_checks(doc: dict):
    """The reported values bound for a column, with where they are in the document."""
    host = doc.get("host", {})
    if "hostname" in host:
        yield "host.hostname", Node, "hostname", host["hostname"]
    for i, gpu in enumerate(doc.get("gpus", [])):
        yield f"gpus[{i}].index", Gpu, "index", gpu["index"]
        for key in ("memory_bytes", "numa_node"):
            if isinstance(gpu.get(key), int):
                yield f"gpus[{i}].{key}", Gpu, key, gpu[key]
    for i, nic in enumerate(doc.get("nics", [])):
        for key in ("mtu", "numa_node"):
            yield f"nics[{i}].{key}", Nic, key, nic.get(key)
        if (nic.get("speed_mbps") or 0) > 0:  # 0 or -1: the kernel does not know the speed
            yield f"nics[{i}].speed_mbps", Nic, "speed_mbps", nic["speed_mbps"]


def _collected_at(doc: dict):
    value = doc.get("collected_at")
    if not isinstance(value, str):
        return None
    try:
        return parse_datetime(value)
    except ValueError:  # well-formed but impossible: 2026-02-30, an offset beyond ±24 h
        raise InventoryError("collected_at", f"{value!r} is not a valid time") from None


def apply_inventory(node: Node, doc) -> dict:
    """Store the inventory on the node: host facts, GPUs (by index) and NICs (by device)."""
    validate_inventory(doc)
    host = doc.get("host", {})
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        node.facts = {key: host[key] for key in HOST_FACTS if key in host}
        node.hostname = str(host.get("hostname", node.hostname))
        node.inventory = doc
        node.inventory_at = _collected_at(doc) or timezone.now()
        node.save(update_fields=["facts", "hostname", "inventory", "inventory_at", "updated"])
        nics = _apply_nics(node, doc.get("nics", []))
        gpus = _apply_gpus(node, doc.get("gpus", []), doc.get("affinity", []), nics)
        node_changed(node)
    return {"gpus": gpus, "nics": len(doc.get("nics", []))}


def _apply_nics(node: Node, reported: list[dict]) -> dict[str, Nic]:
    existing = {n.device: n for n in Nic.objects.filter(node=node)}
    seen = set()
    for entry in reported:
        device = entry["device"]
        seen.add(device)
        nic = existing.get(device) or Nic(
            organization_id=node.organization_id, cluster_id=node.cluster_id, node=node,
            name=f"{node.name}/{device}", device=device,
        )
        nic.kind = entry.get("kind") if entry.get("kind") in ("ethernet", "infiniband") else ""
        for key, limit in (("mac", 64), ("guid", 64), ("rdma_device", 64), ("pci_address", 32)):
            setattr(nic, key, str(entry.get(key) or "")[:limit])
        nic.numa_node = entry.get("numa_node")
        nic.speed_mbps = entry.get("speed_mbps") if (entry.get("speed_mbps") or 0) > 0 else None
        nic.mtu = entry.get("mtu")
        nic.link_state = str(entry.get("link_state") or "unknown")[:16]
        nic.addresses = [str(a) for a in entry.get("addresses", [])][:64]
        nic.health = LINK_HEALTH.get(nic.link_state, Health.UNKNOWN)
        nic.save()
        existing[device] = nic
    for device, nic in list(existing.items()):
        if device in seen:
            continue
        if nic.in_topology:
            # Declared but not seen on the host: the NIC is missing or renamed.
            Nic.objects.filter(pk=nic.pk).update(link_state="absent", health=Health.DOWN)
        else:
            nic.delete()
            del existing[device]
    return existing


def _apply_gpus(node: Node, reported: list[dict], affinity: list[dict], nics: dict[str, Nic]) -> int:
    nearest: dict[str, tuple[int, str]] = {}
    per_gpu: dict[str, list[dict]] = {}
    for pair in affinity:
        gpu_key, nic = str(pair.get("gpu")), str(pair.get("nic"))
        rank = RELATIONS.index(pair["relation"])
        per_gpu.setdefault(gpu_key, []).append({"nic": nic, "relation": pair["relation"]})
        if nic in nics and (gpu_key not in nearest or rank < nearest[gpu_key][0]):
            nearest[gpu_key] = (rank, nic)
    existing = {g.index: g for g in Gpu.objects.filter(node=node)}
    for entry in reported:
        gpu = existing.pop(entry["index"], None) or Gpu(
            organization_id=node.organization_id, cluster_id=node.cluster_id, node=node, index=entry["index"]
        )
        for key, limit in (("uuid", 64), ("name", 200), ("pci_bus_id", 32), ("driver_version", 32),
                           ("cuda_version", 16)):
            setattr(gpu, key, str(entry.get(key) or "")[:limit])
        gpu.memory_bytes = entry.get("memory_bytes")
        gpu.ecc_enabled = entry.get("ecc_enabled") if isinstance(entry.get("ecc_enabled"), bool) else None
        gpu.numa_node = entry.get("numa_node") if isinstance(entry.get("numa_node"), int) else None
        gpu.nvlinks = entry.get("nvlinks") if isinstance(entry.get("nvlinks"), list) else []
        keys = (gpu.uuid, str(gpu.index), gpu.pci_bus_id)
        gpu.affinity = next((per_gpu[k] for k in keys if k in per_gpu), [])
        match = next((nearest[k] for k in keys if k in nearest), None)
        gpu.nearest_nic = nics[match[1]] if match else None
        gpu.health = Health.OK
        gpu.save()
    Gpu.objects.filter(pk__in=[g.pk for g in existing.values()]).delete()
    return len(reported)
