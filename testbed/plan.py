"""The emulated fabric as data: names, interfaces, addresses and routes. Pure (no system calls).

A `Plan` turns a validated `Topology` into everything the emulator creates:

- one network namespace per host and per switch, named ``<prefix>-<device name>``;
- one veth pair per link, created directly inside the two namespaces (so its interface names
  only have to be unique per namespace): a host's NIC keeps the part of its name after the
  last ``/`` when that is a valid interface name (``node0000/nic0`` -> ``nic0``), else
  ``nic<i>``; switch ports are ``p<k>``; every end carries the link id as its interface alias;
- addresses: each switch with NICs cabled to it gets a /24 out of 172.16.0.0/12, and each access
  link in it a /31 (switch side even, NIC odd); switch-to-switch links get /31s out of
  100.64.0.0/10; the management network is one /16 (bridge ``<prefix>mg`` in the root
  namespace holds .0.1, host i holds .0.0+i+2 on ``mgmt0``, its root end is ``<prefix>m<i>``);
- routes: every switch holds one route per NIC block, with every equal-cost next hop on the
  shortest paths (multipath); hosts route per NIC (policy rule ``from <nic address> iif lo`` ->
  table 100+i, before the local table, so traffic between two NICs of a host crosses the fabric)
  and send unbound traffic for a block out of their NIC on that block's rail.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections import deque
from dataclasses import dataclass, field

from workers.fabric.topology import Topology

PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
NS_CHARS_RE = re.compile(r"[^A-Za-z0-9_.-]")

NIC_SPACE = ipaddress.ip_network("172.16.0.0/12")
SWITCH_LINK_SPACE = ipaddress.ip_network("100.64.0.0/10")
MAX_ACCESS_PER_SWITCH = 128
HOST_TABLE_BASE = 100
HOST_RULE_PREF_BASE = 1000
LOCAL_RULE_PREF = 30000
MGMT_IFNAME = "mgmt0"


class PlanError(ValueError):
    """The topology cannot be emulated as given (the message names what and why)."""


@dataclass(frozen=True)
class End:
    """One end of a link: the interface in a namespace."""

    link: str
    device: str  # the NIC name or switch name from the topology
    node: str  # the host or switch name (the namespace owner)
    ns: str
    ifname: str
    address: str
    peer_address: str


@dataclass(frozen=True)
class LinkPlan:
    id: str
    a: End
    b: End
    nic: str | None  # the NIC of an access link (NIC to switch), None between switches

    def end(self, side: str) -> End:
        return self.a if side == "a" else self.b

    def ends(self) -> tuple[End, End]:
        return (self.a, self.b)


@dataclass(frozen=True)
class NicPlan:
    name: str
    host: str
    ns: str
    ifname: str
    address: str
    gateway: str
    switch: str
    link: str
    rail: int | None
    table: int
    index: int  # position among its host's NICs


@dataclass(frozen=True)
class HostPlan:
    name: str
    ns: str
    index: int
    mgmt_address: str
    mgmt_root_ifname: str
    nics: tuple[str, ...]


@dataclass(frozen=True)
class SwitchPlan:
    name: str
    tier: str
    ns: str
    index: int
    ports: tuple[str, ...]  # link ids, port k is ifname p<k>


@dataclass
class Plan:
    prefix: str
    topology: Topology
    mgmt_subnet: ipaddress.IPv4Network
    hosts: dict[str, HostPlan] = field(default_factory=dict)
    switches: dict[str, SwitchPlan] = field(default_factory=dict)
    links: dict[str, LinkPlan] = field(default_factory=dict)
    nics: dict[str, NicPlan] = field(default_factory=dict)
    blocks: dict[str, str] = field(default_factory=dict)  # switch -> NIC block CIDR
    block_rail: dict[str, int | None] = field(default_factory=dict)

    # -- names -------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return bridge_name(self.prefix)

    @property
    def bridge_address(self) -> str:
        return str(self.mgmt_subnet.network_address + 1)

    def namespaces(self) -> list[str]:
        return [h.ns for h in self.hosts.values()] + [s.ns for s in self.switches.values()]

    def root_links(self) -> list[str]:
        return [h.mgmt_root_ifname for h in self.hosts.values()] + [self.bridge]

    def ns_of(self, node: str) -> str:
        """The namespace of a host, switch or NIC name."""
        if node in self.hosts:
            return self.hosts[node].ns
        if node in self.switches:
            return self.switches[node].ns
        if node in self.nics:
            return self.nics[node].ns
        raise KeyError(f"{node!r} is not a host, switch or NIC of topology {self.topology.name!r}")

    def is_switch_ns(self, ns: str) -> bool:
        return any(s.ns == ns for s in self.switches.values())

    # -- what to create ----------------------------------------------------------------------
    def root_batch_create(self) -> list[str]:
        """`ip -batch` lines run in the root namespace: namespaces, veths, management bridge."""
        lines = [f"netns add {ns}" for ns in self.namespaces()]
        for link in self.links.values():
            a, b = link.a, link.b
            lines.append(f"link add name {a.ifname} netns {a.ns} type veth peer name {b.ifname} netns {b.ns}")
        lines.append(f"link add {self.bridge} type bridge")
        lines.append(f"addr add {self.bridge_address}/{self.mgmt_subnet.prefixlen} dev {self.bridge}")
        lines.append(f"link set {self.bridge} up")
        for h in self.hosts.values():
            lines.append(f"link add {h.mgmt_root_ifname} type veth peer name {MGMT_IFNAME} netns {h.ns}")
            lines.append(f"link set {h.mgmt_root_ifname} master {self.bridge} up")
        return lines

    def sysctls(self, ns: str) -> list[tuple[str, str]]:
        common = [
            ("net/ipv6/conf/all/disable_ipv6", "1"),
            ("net/ipv6/conf/default/disable_ipv6", "1"),
            ("net/ipv4/conf/all/rp_filter", "0"),
            ("net/ipv4/conf/default/rp_filter", "0"),
        ]
        if self.is_switch_ns(ns):
            return common + [
                ("net/ipv4/ip_forward", "1"),
                ("net/ipv4/fib_multipath_hash_policy", "1"),
                ("net/ipv4/conf/all/ignore_routes_with_linkdown", "1"),
                ("net/ipv4/conf/default/ignore_routes_with_linkdown", "1"),
                # path discovery: a switch answers an expired probe from the address of the port
                # it came in on (so the answer names the link, see `router_addresses`), and
                # answers every one (a real switch polices its control plane; the emulator
                # does not, so tests can trace quickly)
                ("net/ipv4/icmp_errors_use_inbound_ifaddr", "1"),
                ("net/ipv4/icmp_ratelimit", "0"),
                ("?net/ipv4/icmp_msgs_per_sec", "100000"),
                ("?net/ipv4/icmp_msgs_burst", "10000"),
            ]
        return common + [
            ("net/ipv4/ip_forward", "0"),
            ("net/ipv4/fib_multipath_hash_policy", "1"),
            ("net/ipv4/conf/all/arp_ignore", "1"),
            ("net/ipv4/conf/all/arp_announce", "2"),
            ("net/ipv4/conf/all/accept_local", "1"),  # a packet from the host's other NIC
        ]

    def ns_batch_create(self, ns: str) -> list[str]:
        """`ip -batch` lines run inside one namespace: interfaces up, addresses, rules, routes."""
        lines = ["link set lo up"]
        for end in self.ends_in(ns):
            lines.append(f"addr add {end.address}/31 dev {end.ifname}")
            lines.append(f"link set {end.ifname} up")
        host = next((h for h in self.hosts.values() if h.ns == ns), None)
        if host is not None:
            lines.append(f"addr add {host.mgmt_address}/{self.mgmt_subnet.prefixlen} dev {MGMT_IFNAME}")
            lines.append(f"link set {MGMT_IFNAME} up")
            for nic_name in host.nics:
                nic = self.nics[nic_name]
                lines.append(f"rule add from {nic.address}/32 iif lo table {nic.table} "
                             f"pref {HOST_RULE_PREF_BASE + nic.index}")
            # the local table after the per-NIC rules: traffic from one NIC of the host to another
            # crosses the fabric (as between the rails of a GPU server) instead of staying inside
            lines.append(f"rule add pref {LOCAL_RULE_PREF} lookup local")
            lines.append("rule del pref 0 lookup local")
        lines.extend(self.routes(ns))
        return lines

    def aliases(self, ns: str | None) -> list[tuple[str, str]]:
        """(interface, alias) pairs to record in a namespace (None: the root namespace).

        Written through /sys/class/net/*/ifalias: `ip -batch` would read a '#' in a link id as
        the start of a comment.
        """
        if ns is None:
            return [(h.mgmt_root_ifname, f"lockstep-testbed mgmt {h.name}") for h in self.hosts.values()]
        pairs = [(end.ifname, end.link) for end in self.ends_in(ns)]
        host = next((h for h in self.hosts.values() if h.ns == ns), None)
        if host is not None:
            pairs.append((MGMT_IFNAME, f"lockstep-testbed mgmt {host.name}"))
        return pairs

    def router_addresses(self) -> dict[str, list]:
        """Every interface address of the fabric -> [device, link]: the device that owns it and
        the link a probe arrives on there. Switches answer expired probes from the address of
        their ingress port, so a traceroute's answers name the links of the path; a NIC's own
        address names its access link (the last link of a path to it). The shape of the
        probe.mesh plan's ``routers``."""
        out: dict[str, list] = {}
        for link in self.links.values():
            for end in link.ends():
                out[end.address] = [end.device, link.id]
        return out

    def ends_in(self, ns: str) -> list[End]:
        return [end for link in self.links.values() for end in link.ends() if end.ns == ns]

    # -- routing -----------------------------------------------------------------------------
    def routes(self, ns: str, withdrawn: frozenset[str] = frozenset(),
               down_ifnames: frozenset[str] = frozenset()) -> list[str]:
        """`route replace` lines for one namespace (idempotent).

        `withdrawn`: link ids the whole fabric routes around (as a routing protocol would after
        a link failure). `down_ifnames`: interfaces of this namespace that are administratively
        down; no next hop may use them (the kernel refuses it), and a destination left without
        one becomes `unreachable`.
        """
        host = next((h for h in self.hosts.values() if h.ns == ns), None)
        if host is not None:
            return self._host_routes(host, down_ifnames)
        switch = next((s for s in self.switches.values() if s.ns == ns), None)
        if switch is None:
            raise KeyError(f"namespace {ns!r} is not part of this testbed")
        return self._switch_routes(switch, withdrawn, down_ifnames)

    def _host_routes(self, host: HostPlan, down: frozenset[str]) -> list[str]:
        lines: list[str] = []
        nics = [self.nics[n] for n in host.nics]
        up = [n for n in nics if n.ifname not in down]
        for nic in nics:
            if nic in up:
                lines.append(f"route replace {NIC_SPACE} via {nic.gateway} dev {nic.ifname} src {nic.address} table {nic.table}")
            else:
                lines.append(f"route replace unreachable {NIC_SPACE} table {nic.table}")
        for switch, block in self.blocks.items():
            rail = self.block_rail[switch]
            candidates = [n for n in up if rail is not None and n.rail == rail] or up
            if not candidates:
                lines.append(f"route replace unreachable {block}")
                continue
            nic = candidates[0]
            lines.append(f"route replace {block} via {nic.gateway} dev {nic.ifname} src {nic.address}")
        return lines

    def _switch_routes(self, switch: SwitchPlan, withdrawn: frozenset[str], down: frozenset[str]) -> list[str]:
        lines: list[str] = []
        adjacency = self._switch_adjacency(withdrawn)
        for target, block in self.blocks.items():
            if target == switch.name:
                continue  # the access /31s are connected routes
            dist = _bfs(adjacency, target)
            hops = []
            if switch.name in dist:
                for link_id, neighbor in adjacency.get(switch.name, []):
                    if dist.get(neighbor) == dist[switch.name] - 1:
                        link = self.links[link_id]
                        mine = link.a if link.a.node == switch.name else link.b
                        if mine.ifname not in down:
                            hops.append((mine.peer_address, mine.ifname))
            if not hops:
                lines.append(f"route replace unreachable {block}")
            elif len(hops) == 1:
                lines.append(f"route replace {block} via {hops[0][0]} dev {hops[0][1]}")
            else:
                nexthops = " ".join(f"nexthop via {via} dev {dev}" for via, dev in hops)
                lines.append(f"route replace {block} {nexthops}")
        return lines

    def _switch_adjacency(self, withdrawn: frozenset[str]) -> dict[str, list[tuple[str, str]]]:
        adjacency: dict[str, list[tuple[str, str]]] = {}
        for link in self.links.values():
            if link.nic is not None or link.id in withdrawn:
                continue
            adjacency.setdefault(link.a.node, []).append((link.id, link.b.node))
            adjacency.setdefault(link.b.node, []).append((link.id, link.a.node))
        return adjacency

    def ecmp_paths(self, src_nic: str, dst_nic: str) -> list[list[str]]:
        """Every shortest path (as link ids) from one NIC to another, for tests and tooling."""
        src, dst = self.nics[src_nic], self.nics[dst_nic]
        adjacency = self._switch_adjacency(frozenset())
        dist = _bfs(adjacency, dst.switch)
        paths: list[list[str]] = []

        def walk(node: str, acc: list[str]) -> None:
            if node == dst.switch:
                paths.append([src.link, *acc, dst.link])
                return
            for link_id, neighbor in adjacency.get(node, []):
                if dist.get(neighbor) == dist[node] - 1:
                    walk(neighbor, [*acc, link_id])

        if src.switch in dist:
            walk(src.switch, [])
        return paths


def _bfs(adjacency: dict[str, list[tuple[str, str]]], start: str) -> dict[str, int]:
    dist = {start: 0}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for _, neighbor in adjacency.get(node, []):
            if neighbor not in dist:
                dist[neighbor] = dist[node] + 1
                queue.append(neighbor)
    return dist


def bridge_name(prefix: str) -> str:
    return f"{prefix}mg"


def root_link_re(prefix: str) -> re.Pattern[str]:
    """Root-namespace interfaces a testbed of this prefix creates (its bridge, its mgmt veths)."""
    return re.compile(rf"^{re.escape(prefix)}m(g|\d+)$")


def ns_re(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(prefix)}-")


def check_prefix(prefix: str) -> str:
    if not PREFIX_RE.match(prefix or ""):
        raise PlanError(f"prefix {prefix!r}: use 1 to 8 lowercase letters or digits, starting with a letter")
    return prefix


def default_mgmt_subnet(prefix: str, taken: list[ipaddress.IPv4Network] | tuple = ()) -> ipaddress.IPv4Network:
    """A /16 in 10.200.0.0-10.255.0.0 chosen from the prefix, skipping any in `taken`."""
    start = int(hashlib.sha256(prefix.encode()).hexdigest(), 16) % 56
    for i in range(56):
        net = ipaddress.ip_network(f"10.{200 + (start + i) % 56}.0.0/16")
        if not any(net.overlaps(t) for t in taken):
            return net
    raise PlanError("no free /16 for the management network in 10.200.0.0-10.255.255.255; pass mgmt_subnet")


def build_plan(topology: Topology, prefix: str, mgmt_subnet: str | ipaddress.IPv4Network) -> Plan:
    """Name, address and route every element of `topology`; PlanError if it cannot be emulated."""
    check_prefix(prefix)
    mgmt = ipaddress.ip_network(mgmt_subnet, strict=True) if isinstance(mgmt_subnet, str) else mgmt_subnet
    if mgmt.version != 4 or mgmt.prefixlen > 24:
        raise PlanError(f"management subnet {mgmt}: need an IPv4 network of /24 or larger")
    if mgmt.overlaps(NIC_SPACE) or mgmt.overlaps(SWITCH_LINK_SPACE):
        raise PlanError(f"management subnet {mgmt} overlaps the fabric ({NIC_SPACE}, {SWITCH_LINK_SPACE})")
    if len(topology.hosts) > mgmt.num_addresses - 3:
        raise PlanError(f"management subnet {mgmt} is too small for {len(topology.hosts)} hosts")
    plan = Plan(prefix=prefix, topology=topology, mgmt_subnet=mgmt)
    problems: list[str] = []

    # namespaces
    used: set[str] = set()

    def ns_name(device: str, index: int, kind: str) -> str:
        name = f"{prefix}-{NS_CHARS_RE.sub('_', device)}"
        if name in used or len(name) > 200:
            name = f"{prefix}-{kind}{index}"
        used.add(name)
        return name

    links_of: dict[str, list[str]] = {}
    for link in topology.links:
        for end in (link.a, link.b):
            links_of.setdefault(end, []).append(link.id)
    for nic in topology.nics:
        count = len(links_of.get(nic.name, []))
        if count != 1:
            problems.append(f"NIC {nic.name!r} has {count} links; the emulator needs exactly one cable per NIC")
    for link in topology.links:
        if topology.is_nic(link.a) and topology.is_nic(link.b):
            problems.append(f"link {link.id!r} joins two NICs; every NIC must be cabled to a switch")
    if problems:
        raise PlanError("; ".join(problems[:20]))

    host_ns = {h.name: ns_name(h.name, i, "h") for i, h in enumerate(topology.hosts)}
    switch_ns = {s.name: ns_name(s.name, i, "s") for i, s in enumerate(topology.switches)}

    # NIC interface names and indexes per host
    nic_ifname: dict[str, str] = {}
    nic_index: dict[str, int] = {}
    for h in topology.hosts:
        taken = {"lo", MGMT_IFNAME}
        for i, nic in enumerate(topology.nics_of(h.name)):
            suffix = nic.name.rsplit("/", 1)[-1]
            name = suffix if IFNAME_RE.match(suffix) and suffix not in taken else f"nic{i}"
            while name in taken:
                name = f"n{i}x{len(taken)}"
            taken.add(name)
            nic_ifname[nic.name] = name
            nic_index[nic.name] = i

    # NIC blocks per switch, access /31s, switch /31s
    access_count: dict[str, int] = {}
    for link in topology.links:
        if topology.is_nic(link.a) or topology.is_nic(link.b):
            sw = link.b if topology.is_nic(link.a) else link.a
            access_count[sw] = access_count.get(sw, 0) + 1
    block_index = 0
    block_base: dict[str, ipaddress.IPv4Address] = {}
    for s in topology.switches:
        if s.name in access_count:
            if access_count[s.name] > MAX_ACCESS_PER_SWITCH:
                problems.append(f"switch {s.name!r} has {access_count[s.name]} NICs; at most {MAX_ACCESS_PER_SWITCH}")
            if block_index >= NIC_SPACE.num_addresses // 256:
                problems.append("too many switches with NICs for 172.16.0.0/12")
                break
            base = NIC_SPACE.network_address + block_index * 256
            block_base[s.name] = base
            plan.blocks[s.name] = f"{base}/24"
            block_index += 1
    if problems:
        raise PlanError("; ".join(problems[:20]))

    port_count: dict[str, int] = {}
    ports: dict[str, list[str]] = {s.name: [] for s in topology.switches}
    access_used: dict[str, int] = {}
    switch_link_index = 0

    def port(switch: str, link_id: str) -> str:
        k = port_count.get(switch, 0)
        port_count[switch] = k + 1
        ports[switch].append(link_id)
        return f"p{k}"

    nic_rail: dict[str, set] = {}
    for link in topology.links:
        if topology.is_nic(link.a) or topology.is_nic(link.b):
            nic_side = "a" if topology.is_nic(link.a) else "b"
            nic = topology.nic(link.a if nic_side == "a" else link.b)
            sw = link.b if nic_side == "a" else link.a
            k = access_used.get(sw, 0)
            access_used[sw] = k + 1
            sw_addr = str(block_base[sw] + 2 * k)
            nic_addr = str(block_base[sw] + 2 * k + 1)
            nic_end = End(link.id, nic.name, nic.host, host_ns[nic.host], nic_ifname[nic.name], nic_addr, sw_addr)
            sw_end = End(link.id, sw, sw, switch_ns[sw], port(sw, link.id), sw_addr, nic_addr)
            a, b = (nic_end, sw_end) if nic_side == "a" else (sw_end, nic_end)
            plan.links[link.id] = LinkPlan(link.id, a, b, nic.name)
            rail = nic.rail if nic.rail is not None else nic_index[nic.name]
            nic_rail.setdefault(sw, set()).add(rail)
            plan.nics[nic.name] = NicPlan(
                name=nic.name, host=nic.host, ns=host_ns[nic.host], ifname=nic_ifname[nic.name],
                address=nic_addr, gateway=sw_addr, switch=sw, link=link.id, rail=rail,
                table=HOST_TABLE_BASE + nic_index[nic.name], index=nic_index[nic.name],
            )
        else:
            if switch_link_index >= SWITCH_LINK_SPACE.num_addresses // 2:
                raise PlanError(f"too many switch-to-switch links for {SWITCH_LINK_SPACE}")
            base = SWITCH_LINK_SPACE.network_address + 2 * switch_link_index
            switch_link_index += 1
            a_addr, b_addr = str(base), str(base + 1)
            a = End(link.id, link.a, link.a, switch_ns[link.a], port(link.a, link.id), a_addr, b_addr)
            b = End(link.id, link.b, link.b, switch_ns[link.b], port(link.b, link.id), b_addr, a_addr)
            plan.links[link.id] = LinkPlan(link.id, a, b, None)
    for sw in plan.blocks:
        rails = nic_rail.get(sw, set())
        plan.block_rail[sw] = next(iter(rails)) if len(rails) == 1 else None

    for i, h in enumerate(topology.hosts):
        plan.hosts[h.name] = HostPlan(
            name=h.name, ns=host_ns[h.name], index=i,
            mgmt_address=str(mgmt.network_address + 2 + i),
            mgmt_root_ifname=f"{prefix}m{i}",
            nics=tuple(n.name for n in topology.nics_of(h.name)),
        )
    for i, s in enumerate(topology.switches):
        plan.switches[s.name] = SwitchPlan(s.name, s.tier, switch_ns[s.name], i, tuple(ports[s.name]))
    return plan
