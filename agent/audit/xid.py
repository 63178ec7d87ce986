"""Xid errors: which ones matter, and reading them from the kernel log. Pure.

NVML keeps no history of Xids (its event API only reports new ones), so "Xids since boot" come
from the kernel log, where the driver writes one line per event::

    NVRM: Xid (PCI:0000:18:00): 79, pid=2871, name=python3, GPU has fallen off the bus.

(``/dev/kmsg`` records prefix it with ``level,seq,usec,flags;``; ``dmesg`` with ``[  12.3]``.)

Severity per Xid: the list Azure's node health checks fail a node on
(``customTests/azure_gpu_xid.nhc``: 48 56 57 58 62 63 64 65 68 69 73 74 79 80 81 92 119 120)
plus 94/95 (contained/uncontained ECC errors, DCGM_FR_UNCONTAINED_ERROR for 95); the action
classes follow NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors). Other Xids (13, 31,
43, 45: application faults) are reported as warnings.
"""

from __future__ import annotations

import re

_XID_RE = re.compile(
    r"NVRM: Xid \(PCI:(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?[^)]*\):\s*"
    r"(?P<xid>\d+)\s*,?\s*(?P<text>.*)$"
)
_KMSG_PREFIX_RE = re.compile(r"^\d+,\d+,(?P<usec>\d+),[^;]*;")
_DMESG_PREFIX_RE = re.compile(r"^\[\s*(?P<sec>\d+\.\d+)\]\s*")

# xid -> (severity class, what it means, what to do)
CRITICAL: dict[int, tuple[str, str, str]] = {
    48: ("reset", "uncorrectable double-bit ECC error", "Drain the GPU and reset it; replace it if it recurs."),
    56: ("triage", "display engine error", "Run a field diagnostic on the GPU."),
    57: ("triage", "error programming video memory interface", "Run a field diagnostic on the GPU."),
    58: ("triage", "unstable video memory interface", "Run a field diagnostic on the GPU."),
    62: ("reset", "internal micro-controller halt", "Drain the GPU and reset it."),
    63: ("reset", "ECC page retirement or row remapping recorded", "Reset the GPU when it is idle to apply the remap."),
    64: ("isolate", "ECC page retirement or row remapping failure", "Take the GPU out of service; it needs an RMA."),
    65: ("reset", "video processor exception", "Drain the GPU and reset it."),
    68: ("reset", "NVDEC0 exception", "Drain the GPU and reset it."),
    69: ("reset", "graphics engine class error", "Drain the GPU and reset it."),
    73: ("reset", "NVENC2 error", "Drain the GPU and reset it."),
    74: ("triage", "NVLink error", "Check the NVLink/NVSwitch path of this GPU; reset it, replace the part if it recurs."),
    79: ("isolate", "GPU has fallen off the bus", "Take the node out of service; check the GPU's PCIe/power; RMA."),
    80: ("triage", "corrupted data sent to the GPU", "Run a field diagnostic; check the PCIe path."),
    81: ("triage", "VGA subsystem error", "Run a field diagnostic on the GPU."),
    92: ("monitor", "high single-bit ECC error rate", "Watch the GPU's ECC counters; replace it if the rate grows."),
    94: ("reset", "contained ECC error", "Restart the affected application; reset the GPU when it is idle."),
    95: ("reset", "uncontained ECC error", "Drain the node and reset the GPU."),
    119: ("reset", "GSP RPC timeout", "Drain the GPU and reset it; update the driver if it recurs."),
    120: ("reset", "GSP error", "Drain the GPU and reset it; update the driver if it recurs."),
}


def parse_kernel_log(text: str) -> list[dict]:
    """Xid events in kernel log text (kmsg, dmesg or journal lines), in order.

    Each event: ``{"pci_bus": "0000:18:00", "xid": 79, "text": "...", "t_s": seconds since boot or None}``.
    """
    events = []
    for line in text.splitlines():
        t_s = None
        m = _KMSG_PREFIX_RE.match(line)
        if m:
            t_s = int(m.group("usec")) / 1e6
            line = line[m.end():]
        else:
            m = _DMESG_PREFIX_RE.match(line)
            if m:
                t_s = float(m.group("sec"))
                line = line[m.end():]
        m = _XID_RE.search(line)
        if not m:
            continue
        domain, bus, dev = m.group("bus").lower().split(":")
        events.append({"pci_bus": f"{int(domain, 16):04x}:{bus}:{dev}", "xid": int(m.group("xid")),
                       "text": m.group("text").strip()[:200], "t_s": t_s})
    return events


def bus_of(pci_bus_id: str) -> str:
    """``0000:18:00.0`` (or NVML's ``00000000:18:00.0``) -> ``0000:18:00``, the kernel log's spelling."""
    text = pci_bus_id.strip().lower()
    head, _, _fn = text.rpartition(".")
    head = head or text
    parts = head.split(":")
    if len(parts) != 3:
        return text
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
