"""Fault injection on an emulated fabric: reversible, logged with start and end as ground truth.

Every fault gets an id (``f1``, ``f2``, ...), is kept in the state file while active, and
appends a ``start`` and an ``end`` line to the fault log (JSON lines). Each names its culprit
in the verdict vocabulary of ``formats/fabric.md``: a fault on an access link (the cable from a
NIC to its leaf) is named as the ``nic``, as probes cannot tell the two apart.

| type        | how                                                   | culprit        |
| ----------- | ----------------------------------------------------- | -------------- |
| link-down   | both veth ends admin down (+ fabric reroutes around)  | link (or nic)  |
| link-flap   | a supervised process toggles the link (period, duty)  | link (or nic)  |
| link-loss   | nftables ``numgen random`` drop on egress of one end  | link (or nic)  |
| link-rate   | ``tc tbf`` on one or both ends                        | link (or nic)  |
| switch-loss | nftables random drop of everything a switch forwards  | switch         |
| nic-down    | the NIC's interface admin down in its host            | nic            |
| host-stall  | every process of the host frozen (cgroup / SIGSTOP)   | host           |
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import netops, procs
from .netops import TestbedError

if TYPE_CHECKING:
    from .plan import End, LinkPlan

NFT_TABLE = "lockstep"
NFT_CHAIN = "egress"
LOSS_SCALE = 1_000_000
REPO_ROOT = Path(__file__).resolve().parent.parent


def _now() -> tuple[float, str]:
    t = time.time()
    return t, _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat().replace("+00:00", "Z")


class FaultsMixin:
    """Fault injection methods of `Fabric` (see the module docstring for what each does)."""

    # -- bookkeeping -------------------------------------------------------------------------
    def _link_culprit(self, link: LinkPlan) -> dict:
        return {"kind": "nic", "name": link.nic} if link.nic else {"kind": "link", "name": link.id}

    def _begin(self, ftype: str, target: dict, culprit: dict, params: dict, apply) -> str:
        """Allocate an id, apply the fault (`apply(fault_id) -> dict` of what to undo), record it."""
        with self._mutate() as st:
            fid = f"f{st['next_fault']}"
            st["next_fault"] += 1
            self._check_conflicts(st, ftype, target, params)
            undo = apply(fid)
            t, iso = _now()
            st["faults"][fid] = {"id": fid, "type": ftype, "target": target, "culprit": culprit,
                                 "params": params, "started": t, "apply": undo}
            self._log_event({"event": "start", "id": fid, "type": ftype, "target": target, "culprit": culprit,
                             "params": params, "t": t, "time": iso, "prefix": self.prefix})
        return fid

    def _check_conflicts(self, st: dict, ftype: str, target: dict, params: dict) -> None:
        for other in st["faults"].values():
            if other["type"] in ("link-down", "link-flap") and ftype in ("link-down", "link-flap") \
                    and other["target"] == target:
                raise TestbedError(f"link {target['link']!r} is already under fault {other['id']} ({other['type']})")
            if other["type"] == ftype == "link-rate" and other["target"] == target:
                mine = set(params["ends"])
                if mine & set(other["params"]["ends"]):
                    raise TestbedError(f"link {target['link']!r} already has a rate limit (fault {other['id']}); "
                                       "heal it first")
            if other["type"] == ftype and ftype in ("nic-down", "host-stall") and other["target"] == target:
                raise TestbedError(f"{target} is already under fault {other['id']} ({ftype})")

    def active_faults(self) -> list[dict]:
        """Active faults (id, type, target, culprit, params, started); a flap also says whether its
        flapper process still runs (`flapper_alive`)."""
        self.refresh()
        out = []
        for f in self.state.get("faults", {}).values():
            record = {k: v for k, v in f.items() if k != "apply"}
            flapper = f.get("apply", {}).get("flapper")
            if flapper:
                record["flapper_alive"] = procs.alive(flapper["pid"], flapper["start"])
            out.append(record)
        return out

    def fault_log(self) -> list[dict]:
        """Every start/end event so far (the ground truth of this testbed's faults)."""
        import json
        path = Path(self.state["fault_log"])
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def ground_truth(self, at: float | None = None, window: tuple[float, float] | None = None) -> dict:
        """A `lockstep.verdict/v1` document of the faults active now, at time `at`, or during `window`."""
        if at is None and window is None:
            faults = self.active_faults()
            culprits = [f["culprit"] for f in faults]
        else:
            t0, t1 = window if window is not None else (at, at)
            starts: dict[str, dict] = {}
            ends: dict[str, float] = {}
            for event in self.fault_log():
                if event["event"] == "start":
                    starts[event["id"]] = event
                elif event["event"] == "end":
                    ends[event["id"]] = event["t"]
            culprits = [e["culprit"] for fid, e in starts.items()
                        if e["t"] <= t1 and ends.get(fid, float("inf")) >= t0]
        unique = []
        for c in culprits:
            if c not in unique:
                unique.append(c)
        return {"format": "lockstep.verdict/v1",
                "network_ok": not any(c["kind"] in ("link", "switch", "nic") for c in unique),
                "culprits": [c | {"confidence": 1.0} for c in unique]}

    # -- links ---------------------------------------------------------------------------------
    def _ends_for(self, link: LinkPlan, direction: str) -> list[End]:
        """The ends whose egress carries `direction`: 'a>b', 'b>a', 'both', or an end's device name."""
        if direction in ("a>b", "a"):
            return [link.a]
        if direction in ("b>a", "b"):
            return [link.b]
        if direction == "both":
            return [link.a, link.b]
        for end in link.ends():
            if direction in (end.device, end.node):
                return [end]
        raise TestbedError(f"direction {direction!r}: use 'a>b' (from {link.a.device}), 'b>a' (from "
                           f"{link.b.device}), 'both', or the name of an end of link {link.id!r}")

    def _set_link(self, link: LinkPlan, up: bool) -> None:
        for end in link.ends():
            netops.run(["ip", "-n", end.ns, "link", "set", "dev", end.ifname, "up" if up else "down"])

    def fault_link_down(self, link_id: str, reroute: bool = True) -> str:
        """Take a link down (both ends). With `reroute`, the fabric's routes avoid it, as a routing
        protocol would converge; without, only the two switches touching it drop its next hops."""
        link = self.link(link_id)

        def apply(fid: str) -> dict:
            self._set_link(link, up=False)
            return {}

        fid = self._begin("link-down", {"link": link_id}, self._link_culprit(link), {"reroute": bool(reroute)}, apply)
        self.reapply_routes(None if reroute else self._link_namespaces(link))
        return fid

    def _link_namespaces(self, link: LinkPlan) -> list[str]:
        return sorted({link.a.ns, link.b.ns})

    def fault_link_flap(self, link_id: str, period: float = 2.0, duty: float = 0.5) -> str:
        """Flap a link: down for `duty` x `period` seconds, up for the rest, until healed."""
        link = self.link(link_id)
        if not (period >= 0.1):
            raise TestbedError(f"period {period!r}: must be at least 0.1 s")
        if not (0.0 < duty < 1.0):
            raise TestbedError(f"duty {duty!r}: the fraction of each period the link is down, strictly between 0 and 1")

        def apply(fid: str) -> dict:
            log = self.state_dir / f"flap-{fid}.log"
            cgroup = self.cgroups.ensure("_flap") if self.cgroups.available else None
            argv = [sys.executable, "-m", "testbed.flap", "--base", str(self.state_dir.parent), "--prefix",
                    self.prefix, "--fault", fid, "--link", link_id, "--period", str(period), "--duty", str(duty)]
            with open(log, "ab") as out:
                proc = procs.spawn(argv, cgroup=cgroup, cwd=str(REPO_ROOT), stdout=out, stderr=out,
                                   env=os.environ | {"PYTHONPATH": str(REPO_ROOT)})
            start = None
            deadline = time.monotonic() + 5
            while start is None and time.monotonic() < deadline:
                start = procs.start_time(proc.pid)
            return {"flapper": {"pid": proc.pid, "start": start, "log": str(log)}}

        return self._begin("link-flap", {"link": link_id}, self._link_culprit(link),
                           {"period": float(period), "duty": float(duty)}, apply)

    # -- loss (nftables) -------------------------------------------------------------------------
    def _nft_add(self, ns: str, match: str, rate: float, fid: str) -> None:
        threshold = round(rate * LOSS_SCALE)
        netops.nft(ns, "\n".join([
            f"add table inet {NFT_TABLE}",
            f"add chain inet {NFT_TABLE} {NFT_CHAIN} {{ type filter hook postrouting priority 0 ; policy accept ; }}",
            f'add rule inet {NFT_TABLE} {NFT_CHAIN} {match} numgen random mod {LOSS_SCALE} < {threshold} '
            f'counter drop comment "{fid}"',
        ]) + "\n")

    def _nft_rules(self, ns: str) -> list[dict]:
        doc = netops.nft_json(ns, "list", "chain", "inet", NFT_TABLE, NFT_CHAIN)
        return [item["rule"] for item in doc.get("nftables", []) if "rule" in item]

    def _nft_del(self, ns: str, fid: str) -> None:
        for rule in self._nft_rules(ns):
            if rule.get("comment") == fid:
                netops.nft(ns, f"delete rule inet {NFT_TABLE} {NFT_CHAIN} handle {rule['handle']}\n")

    @staticmethod
    def _check_rate(rate: float) -> float:
        if not isinstance(rate, (int, float)) or not (0.0 < rate <= 1.0):
            raise TestbedError(f"loss rate {rate!r}: a fraction of packets dropped, 0 < rate <= 1 (0.05 = 5%)")
        return float(rate)

    def fault_link_loss(self, link_id: str, direction: str = "a>b", rate: float | None = None) -> str:
        """Drop a random `rate` of the packets crossing a link in one `direction` (or 'both')."""
        link = self.link(link_id)
        rate = self._check_rate(rate)
        ends = self._ends_for(link, direction)

        def apply(fid: str) -> dict:
            for end in ends:
                self._nft_add(end.ns, f'oifname "{end.ifname}"', rate, fid)
            return {"nft": [end.ns for end in ends]}

        params = {"rate": rate, "direction": direction, "ends": [e.device for e in ends]}
        return self._begin("link-loss", {"link": link_id}, self._link_culprit(link), params, apply)

    def fault_switch_loss(self, switch: str, rate: float) -> str:
        """Drop a random `rate` of every packet a switch sends out, on all its ports."""
        sw = self._switch(switch)
        rate = self._check_rate(rate)

        def apply(fid: str) -> dict:
            self._nft_add(sw.ns, "", rate, fid)
            return {"nft": [sw.ns]}

        return self._begin("switch-loss", {"switch": switch}, {"kind": "switch", "name": switch},
                           {"rate": rate}, apply)

    def fault_stats(self, fault_id: str) -> dict:
        """Packets and bytes dropped so far by a loss fault's rules."""
        fault = self.refresh().state["faults"].get(fault_id)
        if fault is None:
            raise TestbedError(f"no active fault {fault_id!r}")
        packets = nbytes = 0
        for ns in fault["apply"].get("nft", []):
            for rule in self._nft_rules(ns):
                if rule.get("comment") == fault_id:
                    for expr in rule.get("expr", []):
                        if "counter" in expr:
                            packets += expr["counter"]["packets"]
                            nbytes += expr["counter"]["bytes"]
        return {"dropped_packets": packets, "dropped_bytes": nbytes}

    # -- rate limit (tc tbf) ---------------------------------------------------------------------
    def fault_link_rate(self, link_id: str, rate_mbit: float, direction: str = "both",
                        burst_kb: float | None = None, latency_ms: float = 50.0) -> str:
        """Cap a link's throughput with a token bucket (a marginal optic, or congestion).

        `latency_ms` bounds the queue: packets wait up to that long behind the limit, so load adds
        delay, then the queue drops. `burst_kb` defaults to about 4 ms of traffic (at least 3 kB).
        """
        link = self.link(link_id)
        if not isinstance(rate_mbit, (int, float)) or rate_mbit <= 0:
            raise TestbedError(f"rate {rate_mbit!r}: a positive number of Mbit/s")
        if latency_ms <= 0:
            raise TestbedError(f"latency {latency_ms!r}: a positive number of milliseconds")
        ends = self._ends_for(link, direction)
        burst = int(burst_kb * 1000) if burst_kb else max(3028, int(rate_mbit * 1e6 / 8 * 0.004))
        rate_kbit = max(1, int(rate_mbit * 1000))

        def apply(fid: str) -> dict:
            for end in ends:
                netops.tc(end.ns, "qdisc", "replace", "dev", end.ifname, "root", "tbf", "rate", f"{rate_kbit}kbit",
                          "burst", str(burst), "latency", f"{latency_ms}ms")
            return {"tbf": [[end.ns, end.ifname] for end in ends]}

        params = {"rate_mbit": float(rate_mbit), "direction": direction, "ends": [e.device for e in ends],
                  "burst_bytes": burst, "latency_ms": float(latency_ms)}
        return self._begin("link-rate", {"link": link_id}, self._link_culprit(link), params, apply)

    # -- NICs and hosts --------------------------------------------------------------------------
    def fault_nic_down(self, nic: str) -> str:
        """Take a NIC's interface down inside its host (its leaf port loses carrier)."""
        n = self._nic(nic)

        def apply(fid: str) -> dict:
            netops.run(["ip", "-n", n.ns, "link", "set", "dev", n.ifname, "down"])
            return {}

        fid = self._begin("nic-down", {"nic": nic}, {"kind": "nic", "name": nic}, {}, apply)
        self.reapply_routes([n.ns])
        return fid

    def fault_host_stall(self, host: str) -> str:
        """Freeze every process in a host's namespace (agent, probe responders, anything else)."""
        h = self._host(host)

        def apply(fid: str) -> dict:
            frozen = False
            if self.cgroups.available:
                self.cgroups.ensure(h.ns)
                frozen = self.cgroups.set_frozen(True, h.ns)
            inside = set(self.cgroups.procs(h.ns)) if frozen else set()
            stopped = []
            for pid in netops.ns_pids(h.ns):
                if pid in inside or pid == os.getpid():
                    continue
                start = procs.start_time(pid)
                if start is not None and procs.state(pid) != "T":
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append([pid, start])
            return {"cgroup": frozen, "stopped": stopped}

        return self._begin("host-stall", {"host": host}, {"kind": "host", "name": host}, {}, apply)

    # -- healing ---------------------------------------------------------------------------------
    def heal(self, fault_id: str) -> dict:
        """Undo one fault and log its end; returns the fault record."""
        with self._mutate() as st:
            fault = st["faults"].get(fault_id)
            if fault is None:
                raise TestbedError(f"no active fault {fault_id!r} (active: {', '.join(st['faults']) or 'none'})")
            reroute = self._undo(fault)
            del st["faults"][fault_id]
            t, iso = _now()
            self._log_event({"event": "end", "id": fault_id, "type": fault["type"], "target": fault["target"],
                             "culprit": fault["culprit"], "t": t, "time": iso,
                             "duration_s": round(t - fault["started"], 6), "prefix": self.prefix})
        if reroute is not None:
            self.reapply_routes(reroute)
        return {k: v for k, v in fault.items() if k != "apply"}

    def heal_all(self) -> list[str]:
        healed = []
        for fault in self.active_faults():
            self.heal(fault["id"])
            healed.append(fault["id"])
        return healed

    def _undo(self, fault: dict) -> list[str] | None:
        """Revert a fault; returns the namespaces whose routes must be reprogrammed (None: none)."""
        ftype, undo = fault["type"], fault.get("apply", {})
        if ftype in ("link-down", "link-flap"):
            link = self.link(fault["target"]["link"])
            flapper = undo.get("flapper")
            if flapper:
                procs.signal_if_same(flapper["pid"], flapper["start"], signal.SIGKILL)
                procs.wait_gone([(flapper["pid"], flapper["start"])], timeout=5)
            self._set_link(link, up=True)
            if ftype == "link-down" and fault["params"].get("reroute"):
                return self.plan.namespaces()
            return self._link_namespaces(link)
        if ftype in ("link-loss", "switch-loss"):
            for ns in undo.get("nft", []):
                self._nft_del(ns, fault["id"])
            return None
        if ftype == "link-rate":
            for ns, ifname in undo.get("tbf", []):
                netops.tc(ns, "qdisc", "del", "dev", ifname, "root", check=False)
            return None
        if ftype == "nic-down":
            n = self._nic(fault["target"]["nic"])
            netops.run(["ip", "-n", n.ns, "link", "set", "dev", n.ifname, "up"])
            return [n.ns]
        if ftype == "host-stall":
            h = self._host(fault["target"]["host"])
            if undo.get("cgroup"):
                self.cgroups.set_frozen(False, h.ns)
            for pid, start in undo.get("stopped", []):
                procs.signal_if_same(pid, start, signal.SIGCONT)
            return None
        raise TestbedError(f"unknown fault type {ftype!r}")

    def _fault_summary(self, fault: dict[str, Any]) -> str:
        c = fault["culprit"]
        params = ", ".join(f"{k}={v}" for k, v in fault["params"].items())
        return f"{fault['id']} {fault['type']} {c['kind']}:{c['name']} ({params})"
