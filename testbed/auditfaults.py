"""Fault kinds the fleet audit is measured against, with ground truth like every testbed fault.

| type           | how                                                                    | culprit       |
| -------------- | ---------------------------------------------------------------------- | ------------- |
| link-police    | nftables ``limit rate over R ... drop`` on egress: passes idle, drops  | link (or nic) |
|                | what exceeds R under load (a policer with a small burst, no queue)     |               |
| nic-mtu        | the NIC's interface MTU changed in its host: small packets pass,       | nic           |
|                | larger ones are dropped where the MTUs disagree                        |               |
| switch-ecmp-off| every multipath route of the switch collapsed to its first next hop:   | switch        |
|                | all flows leave by one uplink (hashing off)                            |               |
| node-gpu       | a GPU defect in the host's NVML fake (agents started with              | host (+gpu)   |
|                | ``testbed.nvmlshim``): ECC, pending remap, Gen4 x8, Xid, throttling... |               |

The two other load-time defects are the base kinds: a cable rate-limited like a degraded optic
is ``link-rate`` (``tc tbf``: a queue, then drops, so load adds delay before loss), and one
direction lossy is ``link-loss --direction``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from . import netops, nvmlshim
from .netops import TestbedError

NFT_TABLE = "lockstep"
NFT_CHAIN = "egress"
_NEXTHOP_RE = re.compile(r"^route replace (\S+) nexthop via (\S+) dev (\S+)(?: nexthop .*)?$")


class AuditFaultsMixin:
    """Fault injection methods of `Fabric` for the audit's defects (see the module docstring)."""

    # -- link-police ---------------------------------------------------------------------------
    def fault_link_police(self, link_id: str, rate_mbit: float, direction: str = "both",
                          burst_kb: float | None = None) -> str:
        """Drop what exceeds `rate_mbit` on a link (no queue, so no added delay): an idle probe
        passes, a loaded flow loses everything above the rate. `burst_kb` defaults to ~2 ms of
        traffic at the rate (at least 3 kB): the policer tolerates hardly any burst."""
        link = self.link(link_id)
        if not isinstance(rate_mbit, (int, float)) or isinstance(rate_mbit, bool) or rate_mbit <= 0:
            raise TestbedError(f"rate {rate_mbit!r}: a positive number of Mbit/s")
        ends = self._ends_for(link, direction)
        kbytes = max(1, int(rate_mbit * 1e6 / 8 / 1000))
        burst = int(burst_kb * 1000) if burst_kb else max(3000, int(rate_mbit * 1e6 / 8 * 0.002))

        def apply(fid: str) -> dict:
            for end in ends:
                netops.nft(end.ns, "\n".join([
                    f"add table inet {NFT_TABLE}",
                    f"add chain inet {NFT_TABLE} {NFT_CHAIN} {{ type filter hook postrouting priority 0 ; "
                    "policy accept ; }",
                    f'add rule inet {NFT_TABLE} {NFT_CHAIN} oifname "{end.ifname}" limit rate over {kbytes} '
                    f'kbytes/second burst {burst} bytes counter drop comment "{fid}"',
                ]) + "\n")
            return {"nft": [end.ns for end in ends]}

        params = {"rate_mbit": float(rate_mbit), "direction": direction, "ends": [e.device for e in ends],
                  "burst_bytes": burst}
        return self._begin("link-police", {"link": link_id}, self._link_culprit(link), params, apply)

    # -- nic-mtu --------------------------------------------------------------------------------
    def fault_nic_mtu(self, nic: str, mtu: int) -> str:
        """Set a NIC's MTU inside its host (the fabric keeps its own): packets larger than the
        smaller of the two MTUs are dropped on the cable where they disagree."""
        n = self._nic(nic)
        if not isinstance(mtu, int) or isinstance(mtu, bool) or not 68 <= mtu <= 65535:
            raise TestbedError(f"mtu {mtu!r}: an integer between 68 and 65535")
        current = next((lk.get("mtu") for lk in netops.links(n.ns) if lk.get("ifname") == n.ifname), None)
        if current is None:
            raise TestbedError(f"NIC {nic!r}: interface {n.ifname} not found in {n.ns}")
        if mtu == current:
            raise TestbedError(f"NIC {nic!r} already has MTU {mtu}; give another MTU to inject a mismatch")

        def apply(fid: str) -> dict:
            netops.run(["ip", "-n", n.ns, "link", "set", "dev", n.ifname, "mtu", str(mtu)])
            return {"mtu": [n.ns, n.ifname, current]}

        return self._begin("nic-mtu", {"nic": nic}, {"kind": "nic", "name": nic},
                           {"mtu": mtu, "fabric_mtu": current}, apply)

    # -- switch-ecmp-off ------------------------------------------------------------------------
    def fault_switch_ecmp_off(self, switch: str) -> str:
        """Turn a switch's ECMP hashing off: each multipath route keeps only its first next hop,
        so every flow leaves by one uplink (and survives route reprogramming until healed)."""
        sw = self._switch(switch)

        def apply(fid: str) -> dict:
            return {"ecmp_off": sw.ns}

        fid = self._begin("switch-ecmp-off", {"switch": switch}, {"kind": "switch", "name": switch}, {}, apply)
        self.reapply_routes([sw.ns])
        return fid

    def _ecmp_off_namespaces(self) -> set[str]:
        return {f["apply"]["ecmp_off"] for f in self.state.get("faults", {}).values()
                if f["type"] == "switch-ecmp-off" and f.get("apply", {}).get("ecmp_off")}

    def _route_lines(self, ns: str, withdrawn: frozenset[str], down: frozenset[str]) -> list[str]:
        """The plan's routes for a namespace, with multipath collapsed where ECMP is off."""
        lines = self.plan.routes(ns, withdrawn, down)
        if ns not in self._ecmp_off_namespaces():
            return lines
        out = []
        for line in lines:
            m = _NEXTHOP_RE.match(line)
            out.append(f"route replace {m.group(1)} via {m.group(2)} dev {m.group(3)}" if m else line)
        return out

    # -- node-gpu -------------------------------------------------------------------------------
    def fault_node_gpu(self, host: str, defect: str, gpu: int = 0) -> str:
        """A GPU defect on a host whose agent reads the NVML fake (``testbed.nvmlshim``)."""
        self._host(host)
        machine = ((self.state.get("agent_config") or {}).get("env") or {}).get(nvmlshim.MACHINE_ENV)
        if not machine:
            raise TestbedError("the agents do not use the NVML fake: start them with "
                               "`python -m testbed agents start --fake-nvml hgx_h100 ...` "
                               "(Python: start_agents(env=testbed.nvmlshim.agent_env('hgx_h100')))")
        try:
            nvmlshim.check_defect(machine, gpu, defect)
        except ValueError as exc:
            raise TestbedError(str(exc)) from exc
        spec_path = nvmlshim.spec_path(self._agent_dir(host) / "state")

        def apply(fid: str) -> dict:
            spec = _read_spec(spec_path, machine)
            spec.setdefault("defects", {}).setdefault(str(gpu), []).append(defect)
            spec.setdefault("faults", {})[fid] = {"gpu": gpu, "defect": defect}
            _write_spec(spec_path, spec)
            return {"nvml_spec": str(spec_path)}

        return self._begin("node-gpu", {"host": host, "gpu": gpu}, {"kind": "host", "name": host, "gpu": gpu,
                                                                   "defect": defect},
                           {"defect": defect, "gpu": gpu, "machine": machine}, apply)

    # -- bookkeeping shared with the base faults -----------------------------------------------
    def _check_conflicts(self, st: dict, ftype: str, target: dict, params: dict) -> None:
        for other in st["faults"].values():
            if other["type"] == ftype and other["target"] == target and ftype in ("nic-mtu", "switch-ecmp-off"):
                raise TestbedError(f"{target} is already under fault {other['id']} ({ftype})")
            if other["type"] == ftype == "link-police" and other["target"] == target \
                    and set(params["ends"]) & set(other["params"]["ends"]):
                raise TestbedError(f"link {target['link']!r} already has a policer (fault {other['id']}); heal it first")
        super()._check_conflicts(st, ftype, target, params)

    def _undo(self, fault: dict) -> list[str] | None:
        ftype, undo = fault["type"], fault.get("apply", {})
        if ftype == "link-police":
            for ns in undo.get("nft", []):
                self._nft_del(ns, fault["id"])
            return None
        if ftype == "nic-mtu":
            ns, ifname, mtu = undo["mtu"]
            netops.run(["ip", "-n", ns, "link", "set", "dev", ifname, "mtu", str(mtu)])
            return None
        if ftype == "switch-ecmp-off":
            return [undo["ecmp_off"]]  # heal() removes the fault, then reprograms the routes
        if ftype == "node-gpu":
            path = Path(undo["nvml_spec"])
            spec = _read_spec(path, fault["params"]["machine"])
            spec.get("faults", {}).pop(fault["id"], None)
            defects: dict[str, list[str]] = {}
            for f in spec.get("faults", {}).values():
                defects.setdefault(str(f["gpu"]), []).append(f["defect"])
            spec["defects"] = defects
            _write_spec(path, spec)
            return None
        return super()._undo(fault)


def _read_spec(path: Path, machine: str) -> dict:
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        spec = {}
    except ValueError as exc:
        raise TestbedError(f"{path} is not JSON ({exc}); remove it and restart the agent") from exc
    spec.setdefault("machine", machine)
    return spec


def _write_spec(path: Path, spec: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=1, sort_keys=True))
    os.replace(tmp, path)
