"""`Fabric`: an emulated cluster in network namespaces, its state file, and its teardown.

    from testbed import Fabric, generate
    fab = Fabric.up(generate(hosts=4, rails=2, hosts_per_leaf=2, spines=2), prefix="lt")
    fab.exec("node0000", ["ping", "-c1", fab.nic_address("node0001/nic0")])
    fid = fab.fault_link_loss("leaf-su00-r0~spine-p0-00#0", rate=0.05, direction="a>b")
    fab.heal(fid)
    fab.down()

Everything a testbed creates is named with its prefix and recorded in
``<base>/<prefix>/state.json`` before it is created, so `down` (or `Fabric.down_all`, after a
crash) removes all of it. The base directory is ``$LOCKSTEP_TESTBED_DIR`` or
``/run/lockstep-testbed``.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from workers.fabric.topology import Topology, TopologyError, parse_topology

from . import netops, procs
from .agents import AgentsMixin
from .auditfaults import AuditFaultsMixin
from .faults import FaultsMixin
from .netops import TestbedError
from .plan import Plan, PlanError, build_plan, check_prefix, default_mgmt_subnet, ns_re, root_link_re

STATE_VERSION = 1
DEFAULT_PREFIX = "lt"


def default_base_dir() -> Path:
    return Path(os.environ.get("LOCKSTEP_TESTBED_DIR") or "/run/lockstep-testbed").absolute()


def load_topology(source: Topology | dict | str | os.PathLike) -> Topology:
    """A Topology from a Topology, a document, or a path to a JSON file (errors name the file)."""
    if isinstance(source, Topology):
        return source
    if isinstance(source, dict):
        return parse_topology(source)
    path = Path(source)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise TestbedError(f"topology file {path} does not exist") from exc
    except json.JSONDecodeError as exc:
        raise TestbedError(f"topology file {path} is not JSON: {exc}") from exc
    try:
        return parse_topology(doc)
    except TopologyError as exc:
        raise TestbedError(f"{path}: {exc}") from exc


class Fabric(AuditFaultsMixin, FaultsMixin, AgentsMixin):
    """A running emulated cluster. Create with `Fabric.up`, reopen with `Fabric.attach`."""

    def __init__(self, state_dir: Path, state: dict):
        self.state_dir = Path(state_dir)
        self.state = state
        self.prefix: str = state["prefix"]
        self.topology: Topology = parse_topology(state["topology"])
        self.plan: Plan = build_plan(self.topology, self.prefix, state["mgmt_subnet"])
        self.cgroups = procs.Cgroups(self.prefix)

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def up(cls, topology: Topology | dict | str | os.PathLike, *, prefix: str = DEFAULT_PREFIX,
           base_dir: str | os.PathLike | None = None, mgmt_subnet: str | None = None,
           fault_log: str | os.PathLike | None = None, workers: int = 4) -> Fabric:
        """Build the fabric; on any failure, remove what was built and raise TestbedError."""
        netops.require_root_and_netns()
        try:
            check_prefix(prefix)
        except PlanError as exc:
            raise TestbedError(str(exc)) from exc
        topo = load_topology(topology)
        base = Path(base_dir).absolute() if base_dir is not None else default_base_dir()
        state_dir = base / prefix
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(state_dir, 0o700)
        with _flock(state_dir / "lock"):
            if (state_dir / "state.json").exists():
                raise TestbedError(f"a testbed with prefix {prefix!r} is already recorded in {state_dir}; "
                                   f"run `python -m testbed --prefix {prefix} down` (or `down --all`) first")
            leftovers = [ns for ns in netops.list_netns() if ns_re(prefix).match(ns)]
            leftovers += [link["ifname"] for link in netops.links() if root_link_re(prefix).match(link["ifname"])]
            if leftovers:
                raise TestbedError(f"leftovers of an earlier testbed with prefix {prefix!r} exist "
                                   f"({', '.join(leftovers[:5])}...); run `python -m testbed down --all --prefix {prefix}`")
            if mgmt_subnet is None:
                taken = []
                for route in netops.root_routes():
                    with contextlib.suppress(ValueError):
                        if route.get("dst", "default") != "default":
                            taken.append(ipaddress.ip_network(route["dst"], strict=False))
                mgmt_subnet = str(default_mgmt_subnet(prefix, taken))
            try:
                plan = build_plan(topo, prefix, mgmt_subnet)
            except (PlanError, ValueError) as exc:
                raise TestbedError(str(exc)) from exc
            state = {
                "version": STATE_VERSION, "prefix": prefix, "phase": "building", "created": time.time(),
                "topology": topo.to_document(), "mgmt_subnet": str(plan.mgmt_subnet),
                "namespaces": plan.namespaces(), "root_links": plan.root_links(),
                "fault_log": str(Path(fault_log).absolute()) if fault_log else str(state_dir / "faults.jsonl"),
                "faults": {}, "next_fault": 1, "agents": {}, "agent_config": None,
            }
            _write_json(state_dir / "state.json", state)  # recorded before anything exists
            fab = cls(state_dir, state)
            t0 = time.monotonic()
            try:
                fab._build(workers)
            except BaseException:
                fab._teardown()
                raise
            with fab._mutate_locked() as st:
                st["phase"] = "up"
                st["bringup_s"] = round(time.monotonic() - t0, 3)
            return fab

    def _build(self, workers: int) -> None:
        plan = self.plan
        netops.ip_batch(plan.root_batch_create())
        netops.set_root_aliases(plan.aliases(None))
        if self.cgroups.available:
            for host in plan.hosts.values():
                self.cgroups.ensure(host.ns, "agent")
                self.cgroups.ensure(host.ns, "procs")
            self.cgroups.ensure("_flap")

        def configure(ns: str) -> None:
            netops.ns_configure(ns, plan.sysctls(ns), plan.aliases(ns), plan.ns_batch_create(ns))

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(configure, plan.namespaces()))

    @classmethod
    def attach(cls, prefix: str = DEFAULT_PREFIX, base_dir: str | os.PathLike | None = None) -> Fabric:
        """Reopen a testbed brought up earlier (by this or another process)."""
        base = Path(base_dir).absolute() if base_dir is not None else default_base_dir()
        path = base / prefix / "state.json"
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise TestbedError(f"no testbed with prefix {prefix!r} under {base} (no {path}); "
                               f"start one with `python -m testbed --prefix {prefix} up ...`") from exc
        return cls(base / prefix, state)

    def down(self) -> None:
        """Stop every process, remove every namespace, veth and bridge, and the state dir."""
        with contextlib.suppress(Exception):  # teardown happens whatever healing runs into
            self.heal_all()  # logs the end of every active fault
        self._teardown()

    def _teardown(self) -> None:
        names = set(self.state.get("namespaces", [])) | set(self.plan.namespaces())
        links = set(self.state.get("root_links", [])) | set(self.plan.root_links())
        _cleanup(self.prefix, self.state_dir, names, links, self.cgroups, self.state)

    @staticmethod
    def down_all(base_dir: str | os.PathLike | None = None, prefixes: Sequence[str] = ()) -> list[str]:
        """Remove every testbed recorded under `base_dir` plus `prefixes`, by name prefix.

        Works after a crash: whatever state survived, namespaces ``<prefix>-*``, root interfaces
        ``<prefix>mg``/``<prefix>m<N>``, the cgroup subtree and processes in them go. Returns
        the prefixes cleaned.
        """
        netops.require_root_and_netns()
        base = Path(base_dir).absolute() if base_dir is not None else default_base_dir()
        found = set(prefixes)
        if base.is_dir():
            found |= {d.name for d in base.iterdir() if d.is_dir()}
        cleaned = []
        for prefix in sorted(found):
            try:
                check_prefix(prefix)
            except PlanError:
                continue
            state_dir = base / prefix
            state: dict = {}
            with contextlib.suppress(OSError, ValueError):
                state = json.loads((state_dir / "state.json").read_text())
            names = {ns for ns in netops.list_netns() if ns_re(prefix).match(ns)} | set(state.get("namespaces", []))
            links = {link["ifname"] for link in netops.links() if root_link_re(prefix).match(link["ifname"])}
            _cleanup(prefix, state_dir, names, links | set(state.get("root_links", [])),
                     procs.Cgroups(prefix), state)
            cleaned.append(prefix)
        return cleaned

    # -- state -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _mutate(self) -> Iterator[dict]:
        """Lock, reload, yield the state to change, save it (other processes may share it)."""
        with _flock(self.state_dir / "lock"), self._mutate_locked() as st:
            yield st

    @contextlib.contextmanager
    def _mutate_locked(self) -> Iterator[dict]:
        path = self.state_dir / "state.json"
        try:
            self.state = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise TestbedError(f"testbed {self.prefix!r} is gone ({path} missing)") from exc
        yield self.state
        _write_json(path, self.state)

    def refresh(self) -> Fabric:
        with contextlib.suppress(FileNotFoundError):
            self.state = json.loads((self.state_dir / "state.json").read_text())
        return self

    def _log_event(self, event: dict) -> None:
        path = Path(self.state["fault_log"])
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(event, sort_keys=True) + "\n")

    # -- lookups -----------------------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        return list(self.plan.hosts)

    @property
    def switches(self) -> list[str]:
        return list(self.plan.switches)

    @property
    def nics(self) -> list[str]:
        return list(self.plan.nics)

    @property
    def links(self) -> list[str]:
        return list(self.plan.links)

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the management network (where a console listens)."""
        return self.plan.bridge_address

    def console_url(self, port: int = 8000, scheme: str = "http") -> str:
        return f"{scheme}://{self.bridge_address}:{port}"

    def ns(self, node: str) -> str:
        """The namespace of a host, switch or NIC."""
        try:
            return self.plan.ns_of(node)
        except KeyError as exc:
            raise TestbedError(str(exc.args[0])) from exc

    def nic_address(self, nic: str) -> str:
        return self._nic(nic).address

    def nic_ifname(self, nic: str) -> str:
        return self._nic(nic).ifname

    def host_nics(self, host: str) -> list[str]:
        return list(self._host(host).nics)

    def mgmt_address(self, host: str) -> str:
        return self._host(host).mgmt_address

    def link(self, link_id: str):
        try:
            return self.plan.links[link_id]
        except KeyError as exc:
            raise TestbedError(f"{link_id!r} is not a link of topology {self.topology.name!r}") from exc

    def router_addresses(self) -> dict[str, list]:
        """Interface address -> [device, link id] (see `Plan.router_addresses`)."""
        return self.plan.router_addresses()

    def ecmp_paths(self, src_nic: str, dst_nic: str) -> list[list[str]]:
        self._nic(src_nic)
        self._nic(dst_nic)
        return self.plan.ecmp_paths(src_nic, dst_nic)

    def _nic(self, nic: str):
        try:
            return self.plan.nics[nic]
        except KeyError as exc:
            raise TestbedError(f"{nic!r} is not a NIC of topology {self.topology.name!r}") from exc

    def _host(self, host: str):
        try:
            return self.plan.hosts[host]
        except KeyError as exc:
            raise TestbedError(f"{host!r} is not a host of topology {self.topology.name!r}") from exc

    def _switch(self, switch: str):
        try:
            return self.plan.switches[switch]
        except KeyError as exc:
            raise TestbedError(f"{switch!r} is not a switch of topology {self.topology.name!r}") from exc

    # -- running things ----------------------------------------------------------------------
    def exec(self, node: str, argv: Sequence[str], *, check: bool = False, timeout: float = 60,
             input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        """Run `argv` to completion inside the namespace of a host, switch or NIC (text output)."""
        return subprocess.run(["ip", "netns", "exec", self.ns(node), *argv], capture_output=True, text=True,
                              timeout=timeout, input=input, env=env, check=check)

    def spawn(self, host: str, argv: Sequence[str], *, stdout=None, stderr=None, env: dict | None = None,
              cwd: str | None = None) -> subprocess.Popen:
        """Start a background process in a host (or switch) namespace.

        Processes of a host are placed in its cgroup, so a host stall freezes them and `down`
        kills them.
        """
        ns = self.ns(host)
        cgroup = None
        if host in self.plan.hosts and self.cgroups.available:
            cgroup = self.cgroups.ensure(ns, "procs")
        return procs.spawn(["ip", "netns", "exec", ns, *argv], cgroup=cgroup, env=env, cwd=cwd,
                           stdout=stdout, stderr=stderr)

    # -- counters and status -----------------------------------------------------------------
    def _ns_links(self, ns: str) -> dict[str, dict]:
        return {link["ifname"]: link for link in netops.links(ns, stats=True)}

    @staticmethod
    def _end_info(end, link: dict | None) -> dict:
        info: dict[str, Any] = {"device": end.device, "ns": end.ns, "ifname": end.ifname, "address": end.address}
        if link is None:
            return info | {"present": False}
        stats = link.get("stats64") or link.get("stats") or {}
        rx, tx = stats.get("rx", {}), stats.get("tx", {})
        return info | {
            "present": True,
            "admin_up": "UP" in link.get("flags", []),
            "carrier": "LOWER_UP" in link.get("flags", []),
            "operstate": link.get("operstate"),
            "rx_packets": rx.get("packets", 0), "tx_packets": tx.get("packets", 0),
            "rx_bytes": rx.get("bytes", 0), "tx_bytes": tx.get("bytes", 0),
            "rx_dropped": rx.get("dropped", 0), "tx_dropped": tx.get("dropped", 0),
        }

    def link_counters(self, link_id: str) -> dict[str, dict]:
        """Interface state and counters at both ends: {"a": {...}, "b": {...}}."""
        link = self.link(link_id)
        return {side: self._end_info(end, self._ns_links(end.ns).get(end.ifname))
                for side, end in (("a", link.a), ("b", link.b))}

    def all_link_counters(self) -> dict[str, dict[str, dict]]:
        """`link_counters` of every link, with one `ip` call per namespace."""
        by_ns = {ns: self._ns_links(ns) for ns in self.plan.namespaces()}
        return {lid: {side: self._end_info(end, by_ns[end.ns].get(end.ifname))
                      for side, end in (("a", link.a), ("b", link.b))}
                for lid, link in self.plan.links.items()}

    def status(self) -> dict:
        self.refresh()
        present = set(netops.list_netns())
        counters = self.all_link_counters()
        return {
            "prefix": self.prefix, "state_dir": str(self.state_dir), "phase": self.state.get("phase"),
            "topology": self.topology.name, "bringup_s": self.state.get("bringup_s"),
            "management": {"bridge": self.plan.bridge, "address": self.bridge_address,
                           "subnet": str(self.plan.mgmt_subnet)},
            "hosts": [{"name": h.name, "ns": h.ns, "present": h.ns in present, "mgmt_address": h.mgmt_address,
                       "nics": [{"name": n, "ifname": self.plan.nics[n].ifname,
                                 "address": self.plan.nics[n].address, "link": self.plan.nics[n].link}
                                for n in h.nics]}
                      for h in self.plan.hosts.values()],
            "switches": [{"name": s.name, "tier": s.tier, "ns": s.ns, "present": s.ns in present,
                          "block": self.plan.blocks.get(s.name)} for s in self.plan.switches.values()],
            "links": [{"id": lid, "a": f"{link.a.device}:{link.a.ifname}", "b": f"{link.b.device}:{link.b.ifname}",
                       "up": all(counters[lid][s].get("admin_up") and counters[lid][s].get("carrier")
                                 for s in ("a", "b")),
                       "tx_packets": {s: counters[lid][s].get("tx_packets") for s in ("a", "b")}}
                      for lid, link in self.plan.links.items()],
            "faults": self.active_faults(),
            "agents": self.agents(),
        }

    # -- routes ------------------------------------------------------------------------------
    def _withdrawn(self) -> frozenset[str]:
        return frozenset(f["target"]["link"] for f in self.state.get("faults", {}).values()
                         if f["type"] == "link-down" and f["params"].get("reroute"))

    def reapply_routes(self, namespaces: Sequence[str] | None = None) -> None:
        """Reprogram routes (idempotent `route replace`) in the given namespaces (default: all).

        Reads which interfaces are administratively down there and routes around them; links
        withdrawn by a rerouting link-down fault are avoided fabric-wide.
        """
        self.refresh()
        withdrawn = self._withdrawn()
        targets = list(namespaces) if namespaces is not None else self.plan.namespaces()

        def apply(ns: str) -> None:
            down = frozenset(link["ifname"] for link in netops.links(ns) if "UP" not in link.get("flags", []))
            netops.ip_batch(self._route_lines(ns, withdrawn, down), ns=ns)

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(apply, targets))

    def routes(self, node: str) -> list[dict]:
        """The routes of a namespace as `ip -j route` reports them (main table)."""
        proc = netops.run(["ip", "-n", self.ns(node), "-j", "route", "show"])
        return json.loads(proc.stdout or "[]")


# -- helpers -----------------------------------------------------------------------------------
@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _cleanup(prefix: str, state_dir: Path, namespaces: set[str], root_links: set[str],
             cgroups: procs.Cgroups, state: dict) -> None:
    """Remove everything of one prefix; tolerant of any part being already gone."""
    # 1. processes: the recorded ones, the cgroup subtree, flappers found by command line, and
    #    anything still running inside our namespaces (SIGCONT first so stopped ones die cleanly)
    recorded: list[tuple[int, int | None]] = []
    for agent in (state.get("agents") or {}).values():
        recorded.append((agent.get("pid"), agent.get("start")))
    for fault in (state.get("faults") or {}).values():
        flapper = fault.get("apply", {}).get("flapper")
        if flapper:
            recorded.append((flapper["pid"], flapper["start"]))
    for pid, start in recorded:
        if pid:
            procs.signal_if_same(pid, start, signal.SIGKILL)
    if cgroups.available:
        cgroups.kill()
    for pid in procs.find_by_cmdline("testbed.flap", "--prefix", prefix, "--base", str(state_dir.parent)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    present = set(netops.list_netns())
    victims: list[tuple[int, int | None]] = []
    for ns in sorted(namespaces & present):
        for pid in netops.ns_pids(ns):
            start = procs.start_time(pid)
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            victims.append((pid, start))
    procs.wait_gone(victims + [(p, s) for p, s in recorded if p], timeout=5)
    # 2. links and namespaces, in one batch (-force: keep going past ones already gone)
    existing_links = {link["ifname"] for link in netops.links()}
    lines = [f"link del {name}" for name in sorted(root_links & existing_links) if not name.endswith("mg")]
    lines += [f"link del {name}" for name in sorted(root_links & existing_links) if name.endswith("mg")]
    lines += [f"netns del {ns}" for ns in sorted(namespaces & present)]
    if lines:
        netops.ip_batch(lines, force=True, check=False)
    # 3. cgroups and files
    if cgroups.available:
        cgroups.remove(5.0)
    if state_dir.exists():
        shutil.rmtree(state_dir, ignore_errors=True)
    left = [ns for ns in netops.list_netns() if ns in namespaces]
    left += [link["ifname"] for link in netops.links() if link["ifname"] in root_links]
    if left:
        raise TestbedError(f"teardown of {prefix!r} left {', '.join(left)} behind")
