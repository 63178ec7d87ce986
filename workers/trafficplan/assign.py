"""From a traffic plan to each agent's ``audit.load`` arguments. Pure.

    args_by_host = agent_args(plan, topology, addresses, run=7, start_at=t0 + 5, duration_s=10,
                              rate_mbit=50)

``addresses``: NIC name -> IPv4 address (from the inventory: ``<host>/<device>`` is the reported
interface ``<device>``). Every host with a NIC in the plan gets the flows leaving its NICs and a
listener per NIC with the flows arriving there; the same ``start_at`` for all, so the whole
fabric is loaded at once. ``rate_mbit`` is per flow: a NIC offers ``flows_per_nic x rate_mbit``.
"""

from __future__ import annotations

from workers.fabric.topology import Topology
from workers.trafficplan.plan import PlanError, TrafficPlan


def device_of(nic: str) -> str:
    """The interface of a topology NIC ``<host>/<device>`` (agent protocol, "NIC binding")."""
    return nic.rsplit("/", 1)[-1]


def agent_args(plan: TrafficPlan, topology: Topology, addresses: dict[str, str], *, run: int, start_at: float,
               duration_s: float, rate_mbit: float, window_s: float = 1.0, packet_bytes: int = 1400,
               protocol: str = "udp", grace_s: float = 1.0, devices: dict[str, str] | None = None,
               trace_ttl: int = 0, trace_extra: int = 0) -> dict[str, dict]:
    """{host: audit.load arguments}; PlanError names a NIC without an address."""
    if protocol not in ("udp", "tcp"):
        raise PlanError(f"protocol {protocol!r}: use 'udp' or 'tcp'")
    if protocol == "udp" and not rate_mbit > 0:
        raise PlanError(f"rate_mbit {rate_mbit!r}: UDP flows need a positive rate per flow")
    missing = sorted({n for f in plan.flows for n in (f.src, f.dst) if n not in addresses})
    if missing:
        raise PlanError(f"no address for NIC {missing[0]!r}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    devices = devices or {}
    base = {"run": int(run), "start_at": float(start_at), "duration_s": float(duration_s), "window_s": float(window_s),
            "grace_s": float(grace_s), "packet_bytes": int(packet_bytes), "protocol": protocol}
    if trace_ttl:
        base |= {"trace_ttl": int(trace_ttl), "trace_extra": int(trace_extra)}
    out: dict[str, dict] = {}
    listeners: dict[str, dict] = {}
    for f in plan.flows:
        src_host, dst_host = topology.nic(f.src).host, topology.nic(f.dst).host
        out.setdefault(src_host, base | {"flows": [], "listen": []})["flows"].append({
            "id": f.id, "src": f.src, "src_addr": addresses[f.src], "device": devices.get(f.src, device_of(f.src)),
            "dst": f.dst, "dst_addr": addresses[f.dst], "sport": f.sport, "dport": plan.dport,
            "rate_mbit": float(rate_mbit)})
        agent = out.setdefault(dst_host, base | {"flows": [], "listen": []})
        lis = listeners.get(f.dst)
        if lis is None:
            lis = listeners[f.dst] = {"nic": f.dst, "addr": addresses[f.dst], "device": devices.get(f.dst, device_of(f.dst)),
                                      "port": plan.dport, "flows": []}
            agent["listen"].append(lis)
        lis["flows"].append({"id": f.id, "src": f.src})
    return out
