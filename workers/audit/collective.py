"""The audit's collective bandwidth phase: which ranks run together, and its findings. Pure.

Groups (``groups``): one per rail — a rank on every host, bound to that host's NIC of the rail,
all rails at once (each rail's NICs carry only their own group) — then one across the cluster, a
rank per host over all of its fabric NICs (gloo spreads a group's connections over the listed
interfaces; NCCL uses every NIC it finds). A rank 0 on the group's first host holds the
rendezvous. The agents run ``audit.collective`` (``agent.audit.collective``: bus bandwidth as
nccl-tests computes it, checked against the threshold the command names).

Findings (``findings``): per group, the bus bandwidth at the largest size against the threshold;
a group whose node did not answer, or whose ranks did not finish, fails with the reason. A slow
group names no culprit: it says that a rail (or the cluster) is slow; the loaded fabric and the
node checks say where.
"""

from __future__ import annotations

from workers.fabric.topology import Topology

CODE_LOW = "DCGM_FR_LOW_BANDWIDTH"
CODE_NOT_RUN = "LOCKSTEP_FR_COLLECTIVE_NOT_RUN"
BASE_PORT = 29400
PORT_SPAN = 20000


def groups(topology: Topology, hosts: list[str], addresses: dict[str, str], devices: dict[str, str],
           run: int) -> list[dict]:
    """``[{"name", "step": "rails" | "cluster", "init", "members": [{"host", "rank", "ifnames"}]}]``.

    `hosts`: the audited hosts (every host of the topology); `addresses`/`devices`: NIC -> its
    address / its interface name. A rail whose NICs are not on every host, or lack an address or
    an interface name, has no group (the cluster group still runs over the NICs that have them).
    """
    ordered = sorted(hosts)
    rails = sorted({n.rail for n in topology.nics if n.rail is not None and n.host in ordered})
    port = BASE_PORT + (run * (len(rails) + 1)) % PORT_SPAN
    out = []
    for i, rail in enumerate(rails):
        nics = {n.host: n.name for n in topology.nics if n.rail == rail and n.host in ordered}
        if set(nics) != set(ordered) or any(nic not in addresses or nic not in devices for nic in nics.values()):
            continue
        out.append({"name": f"rail {rail}", "step": "rails", "init": f"tcp://{addresses[nics[ordered[0]]]}:{port + i}",
                    "members": [{"host": h, "rank": r, "ifnames": [devices[nics[h]]]} for r, h in enumerate(ordered)]})
    usable = {h: sorted(devices[n.name] for n in topology.nics_of(h) if n.name in devices and n.name in addresses)
              for h in ordered}
    first = next((n.name for n in topology.nics_of(ordered[0]) if n.name in addresses), None) if ordered else None
    if first is not None and all(usable.values()):
        out.append({"name": "cluster", "step": "cluster", "init": f"tcp://{addresses[first]}:{port + len(rails)}",
                    "members": [{"host": h, "rank": r, "ifnames": usable[h]} for r, h in enumerate(ordered)]})
    return out


def findings(results: list[dict]) -> list[dict]:
    """One finding per group from ``[{"name", "world_size", "answers": {host: result or None}}]``
    (None: the node did not answer; a result: its ``lockstep.audit.collective/v1``)."""
    out = []
    for g in results:
        answers = g["answers"]
        missing = sorted(h for h, a in answers.items() if a is None)
        ran = [a for a in answers.values() if a is not None]
        element = {"kind": "fleet", "name": f"collective {g['name']}"}
        if missing or not ran or any(a.get("check", {}).get("status") == "error" for a in ran):
            why = (f"{len(missing)} nodes did not answer ({', '.join(missing[:5])})" if missing else
                   "; ".join(e for a in ran for e in a.get("errors", []))[:300] or "its ranks did not finish")
            out.append({"phase": "collective", "element": element, "check": "collective.busbw", "status": "fail",
                        "code": CODE_NOT_RUN, "severity": "triage",
                        "message": f"The {g['name']} collective did not run: {why}.",
                        "action": "Check torch on the nodes, the rendezvous address and the ranks' errors.",
                        "evidence": {"world_size": g["world_size"], "missing": missing}, "threshold": {},
                        "culprit": False})
            continue
        check = ran[0]["check"]  # every rank reports the group's average time: the same bandwidth
        status = check.get("status", "error")
        ev = dict(check.get("evidence") or {}) | {"world_size": g["world_size"], "op": ran[0].get("op"),
                                                  "backend": ran[0].get("backend")}
        out.append({"phase": "collective", "element": element, "check": "collective.busbw",
                    "status": {"pass": "pass", "skip": "pass"}.get(status, "fail" if status == "fail" else "warn"),
                    "code": check.get("code") or ("" if status in ("pass", "skip") else CODE_LOW),
                    "severity": check.get("severity") or "",
                    "message": f"{g['name']}: {check.get('message', '')}",
                    "action": check.get("action") or "",
                    "evidence": ev, "threshold": check.get("threshold") or {}, "culprit": False})
    return out
