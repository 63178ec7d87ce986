"""The ``clock.sync`` plan: the arguments of ``activity.set`` for clock sync, strictly checked.

Pure (no I/O, no numpy). Documented in docs/agent-protocol.md, "Clock sync"::

    {"name": "node0000", "address": "172.16.0.1", "interface": "nic0", "port": 31900,
     "peers": [["node0001", "172.16.0.3"], ["node0002", "172.16.1.1"]],
     "rate_hz": 200, "window_s": 2.0,
     "correction": {"offset_ns": -1830.5, "drift_ppm": 0.41, "sigma_ns": 120.0,
                    "t_ref_ns": 1796403600123456789, "reference": "node0000"}}

Each pair is probed both ways by both ends (each end must list the other: the prober answers
only the peers it knows) and estimated by the end whose name sorts first. ``correction`` is
what the console's network solve found for this node — local clock − reference clock =
``offset_ns + drift_ppm·1e-6·(t − t_ref_ns)``, ``t_ref_ns`` on this node's clock — or null
before the first solve (the node then serves its own clock, ``synced: false``).
"""

from __future__ import annotations

import ipaddress
import math
import re

from agent.commands.registry import Arg, ArgError

MAX_PEERS = 64
NAME_RE = re.compile(r'^[!#-\[\]-~]{1,200}$')  # printable ASCII, no space, no '"' or '\'
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
CORRECTION_KEYS = {"offset_ns", "drift_ppm", "sigma_ns", "t_ref_ns", "reference"}
MAX_ABS_OFFSET_NS = 3600e9
MAX_ABS_DRIFT_PPM = 1000.0

ARGS = {
    "name": Arg(str, default="", max_len=200, help="this node's name in the probe graph"),
    "address": Arg(str, default="", max_len=15, help="the IPv4 address to probe from (a fabric NIC's)"),
    "interface": Arg(str, default="", max_len=15, help="bind to this interface (empty: the one holding address)"),
    "port": Arg(int, default=31900, min=1, max=65535, help="UDP port of every node's prober"),
    "peers": Arg(list, default=[], max_len=MAX_PEERS, help="[[name, address], ...]: the peers to probe"),
    "rate_hz": Arg(float, default=200.0, min=1.0, max=2000.0, help="coded probes per second per peer"),
    "window_s": Arg(float, default=2.0, min=0.5, max=30.0, help="the estimation window, and how often"),
    "correction": Arg(dict, default=None, help="the network solve's result for this node (null: none yet)"),
}


def _address(value, where: str) -> str:
    try:
        addr = ipaddress.IPv4Address(value) if isinstance(value, str) else None
    except ValueError:
        addr = None
    if addr is None or addr.is_multicast or addr.is_unspecified:
        raise ArgError(f"{where}: {value!r} is not a unicast IPv4 address")
    return str(addr)


def _number(value, where: str, bound: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArgError(f"{where}: must be a finite number, not {value!r}")
    if bound is not None and abs(value) > bound:
        raise ArgError(f"{where}: must be within ±{bound:g}, not {value!r}")
    return float(value)


def check(plan: dict) -> dict:
    """The plan normalized, or ArgError naming the field (``peers[2][1]: ...``)."""
    out = dict(plan)
    peers = plan["peers"]
    if peers or plan["correction"] is not None:
        if not NAME_RE.match(plan["name"]):
            raise ArgError(f"name: {plan['name']!r} is not a node name (1-200 printable characters, no spaces)")
        out["address"] = _address(plan["address"], "address")
    if plan["interface"] and not IFNAME_RE.match(plan["interface"]):
        raise ArgError(f"interface: {plan['interface']!r} is not an interface name")
    seen: set[str] = set()
    out["peers"] = []
    for i, peer in enumerate(peers):
        if not isinstance(peer, list) or len(peer) != 2:
            raise ArgError(f"peers[{i}]: must be [name, address]")
        name, address = peer
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ArgError(f"peers[{i}][0]: {name!r} is not a node name")
        if name == plan["name"]:
            raise ArgError(f"peers[{i}][0]: a node does not probe itself")
        if name in seen:
            raise ArgError(f"peers[{i}][0]: {name!r} is listed twice")
        seen.add(name)
        out["peers"].append([name, _address(address, f"peers[{i}][1]")])
    corr = plan["correction"]
    if corr is not None:
        unknown = sorted(set(corr) - CORRECTION_KEYS)
        if unknown:
            raise ArgError(f"correction.{unknown[0]}: unknown key")
        for key in ("offset_ns", "drift_ppm", "sigma_ns", "t_ref_ns"):
            if key not in corr:
                raise ArgError(f"correction.{key}: is required")
        sigma = _number(corr["sigma_ns"], "correction.sigma_ns", MAX_ABS_OFFSET_NS)
        if sigma < 0:
            raise ArgError(f"correction.sigma_ns: must be at least 0, not {corr['sigma_ns']!r}")
        t_ref = corr["t_ref_ns"]
        if isinstance(t_ref, bool) or not isinstance(t_ref, int) or not 0 < t_ref < 2**63:
            raise ArgError(f"correction.t_ref_ns: must be a positive integer of ns, not {t_ref!r}")
        reference = corr.get("reference")
        if reference is not None and (not isinstance(reference, str) or not NAME_RE.match(reference)):
            raise ArgError(f"correction.reference: {reference!r} is not a node name")
        out["correction"] = {"offset_ns": _number(corr["offset_ns"], "correction.offset_ns", MAX_ABS_OFFSET_NS),
                             "drift_ppm": _number(corr["drift_ppm"], "correction.drift_ppm", MAX_ABS_DRIFT_PPM),
                             "sigma_ns": sigma, "t_ref_ns": t_ref, "reference": reference}
    return out


def estimated_by_me(me: str, peer: str) -> bool:
    """Each pair is estimated once, by the end whose name sorts first."""
    return me < peer
