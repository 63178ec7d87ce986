"""The ``probe.mesh`` plan: its arguments, their strict validation, and what the engines run.

Pure (no I/O). The plan is the argument of ``activity.set`` for ``probe.mesh`` (documented in
docs/agent-protocol.md, "Probe mesh")::

    {"nics": [{"name": "node0000/nic0", "interface": "nic0", "address": "172.16.0.1",
               "peers": [["node0001/nic0", "172.16.0.3"], ["node0002/nic0", "172.16.1.1"]]}],
     "interval_ms": 10, "window_ms": 1000, "port": 31901,
     "sport_first": 40000, "sport_count": null, "ecmp_paths": 16, "coverage": 0.99,
     "deadline_floor_ms": 5, "deadline_rtt_k": 4, "deadline_max_ms": null,
     "payload_bytes": 0, "dscp": 0, "timestamps": "auto", "tx_timestamps": true, "engine": "auto",
     "paths": {"enabled": true, "max_ttl": 8, "traces_per_s": 50, "refresh_s": 600, "timeout_ms": 500},
     "routers": {"172.16.0.0": ["leaf-su00-r0", "node0000/nic0~leaf-su00-r0"]}}

Every NIC of the host that takes part is listed, also one without peers: it still answers the
probes of others. Errors are :class:`~agent.commands.ArgError` sentences naming the field
(``nics[2].peers[7][1]: '10.0.0.300' is not an IPv4 address``).

Source ports: each probe of a pair leaves from the next port of the NIC's set (a per-pair
permutation), so the pair's probes spread over its ECMP paths. With ``n`` ports hashed uniformly
onto ``m`` equal-cost paths, the probability that every path carries some of them is
(inclusion-exclusion)::

    P(n, m) = sum_{j=0..m} (-1)^j C(m, j) (1 - j/m)^n

and the set has the smallest ``n`` with ``P(n, m) >= coverage`` (:func:`ports_for_paths`; for
coverage 0.99: m = 2 -> 8, 4 -> 21, 8 -> 51, 16 -> 115, 32 -> 255, 64 -> 557). ``ecmp_paths``
is the largest number of equal-cost paths of any pair (the console knows it from the topology).
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field

from agent.commands.registry import Arg, ArgError

MAX_NICS = 16
MAX_PEERS_PER_NIC = 512
MAX_PEERS = 8192
MAX_SPORTS = 1024
MAX_SOCKETS = 16384
MAX_RATE = 200_000  # probes per second sent by one host, the native helper's bound
MAX_PROBES_PER_WINDOW = 2000  # per peer
MAX_ROUTERS = 65536
MASK_HORIZON = 60  # a probe's direction is resolved by the echoes of the next 64 sequence numbers
WINDOWS_IN_FLIGHT = 6  # the helper keeps 8 windows per peer; emission must come within 6
NAME_RE = re.compile(r'^[!#-\[\]-~]{1,64}$')  # printable ASCII, no space, no '"' or '\'
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
RESPONDER_PORT = 31901
NIC_KEYS = {"name", "interface", "address", "peers"}
PATHS_DEFAULTS = {"enabled": True, "max_ttl": 8, "traces_per_s": 50.0, "refresh_s": 600.0, "timeout_ms": 500.0}

ARGS = {
    "nics": Arg(list, default=[], max_len=MAX_NICS,
                help="the host's NICs that take part: {name, interface, address, peers: [[name, address]]}"),
    "interval_ms": Arg(float, default=10.0, min=1.0, max=10000.0, help="one probe per peer every this long"),
    "window_ms": Arg(int, default=1000, min=100, max=10000, help="the aggregation window"),
    "port": Arg(int, default=RESPONDER_PORT, min=1, max=65535, help="the responders' UDP port (every host the same)"),
    "sport_first": Arg(int, default=40000, min=1024, max=65535, help="the first source port of each NIC's set"),
    "sport_count": Arg(int, default=None, min=1, max=MAX_SPORTS,
                       help="source ports per NIC; null: the smallest set covering ecmp_paths at coverage"),
    "ecmp_paths": Arg(int, default=16, min=1, max=4096, help="the most equal-cost paths of any pair"),
    "coverage": Arg(float, default=0.99, min=0.5, max=0.999999,
                    help="the probability that a pair's ports reach every one of its paths"),
    "deadline_floor_ms": Arg(float, default=5.0, min=0.1, max=1000.0,
                             help="a probe unanswered this long (at least) is lost"),
    "deadline_rtt_k": Arg(float, default=4.0, min=1.0, max=100.0,
                          help="the deadline is max(floor, k x the pair's RTT p99 of its last window)"),
    "deadline_max_ms": Arg(float, default=None, min=0.1, max=1000.0,
                           help="the deadline's cap (and the deadline before any RTT is known); "
                                "null: min(200 ms, what the interval allows)"),
    "payload_bytes": Arg(int, default=0, min=0, max=8972, help="UDP payload size; 0: the smallest (72-96 bytes)"),
    "dscp": Arg(int, default=0, min=0, max=63, help="the probes' DSCP (their traffic class)"),
    "timestamps": Arg(str, default="auto", choices=("auto", "software", "hardware"),
                      help="auto: hardware stamps where the NIC has them on; hardware: also switch them on"),
    "tx_timestamps": Arg(bool, default=True,
                         help="kernel transmit stamps (from the error queue); false: user-space send times, "
                              "about a quarter less CPU"),
    "engine": Arg(str, default="auto", choices=("auto", "native", "python"),
                  help="auto: the native helper when built, else the slower Python engine"),
    "paths": Arg(dict, default=None, help="path discovery: {enabled, max_ttl, traces_per_s, refresh_s, timeout_ms}"),
    "routers": Arg(dict, default=None,
                   help="interface address -> [device, link id or null]: where a probe arrives at that address"),
}


@dataclass(frozen=True)
class NicPlan:
    name: str
    interface: str | None
    address: str
    peers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class EngineConfig:
    """What an engine runs: NICs, peers (flattened, in plan order) and timing in ns."""

    nics: tuple[NicPlan, ...]
    peers: tuple[tuple[int, str, str], ...]  # (nic index, peer name, peer address)
    window_ns: int
    interval_ns: int
    port: int
    sport_first: int
    sport_count: int
    deadline_floor_ns: int
    deadline_k_milli: int
    deadline_max_ns: int
    grace_ns: int
    margin_ns: int
    payload: int
    dscp: int
    hw: int  # 0 software, 1 hardware where on, 2 switch it on
    txts: int  # 1: kernel TX stamps
    paths: dict = field(default_factory=dict)
    routers: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return len(self.peers) * 1e9 / self.interval_ns


def ports_for_paths(paths: int, coverage: float) -> int:
    """The fewest source ports that reach each of `paths` equal-cost paths with probability
    `coverage` under uniform hashing (the module docstring's P(n, m))."""
    if paths <= 1:
        return 1
    n = paths
    while _p_all(n, paths) < coverage:
        n += max(1, n // 64)
        if n > 1 << 20:
            break
    while n > paths and _p_all(n - 1, paths) >= coverage:  # the coarse step may overshoot
        n -= 1
    return n


def _p_all(n: int, m: int) -> float:
    return sum((-1) ** j * math.comb(m, j) * (1 - j / m) ** n for j in range(m + 1))


def grace_ms(interval_ms: float) -> float:
    """How long a lost probe waits for later echoes to tell which way it was lost."""
    return min(200.0, max(20.0, 4 * interval_ms))


def margin_ms(window_ms: int) -> float:
    """Extra wait before a window is emitted, for probes of peers whose clocks run a little behind."""
    return min(50.0, window_ms / 4)


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ArgError(f"{where}: {value!r} is not a name (1-64 printable characters, no spaces, quotes "
                       "or backslashes)")
    return value


def _address(value, where: str) -> str:
    try:
        addr = ipaddress.IPv4Address(value) if isinstance(value, str) else None
    except ValueError:
        addr = None
    if addr is None:
        raise ArgError(f"{where}: {value!r} is not an IPv4 address")
    if addr.is_multicast or addr.is_unspecified or addr == ipaddress.IPv4Address("255.255.255.255"):
        raise ArgError(f"{where}: {value} cannot be probed (multicast, unspecified or broadcast)")
    return str(addr)


def _nic(value, i: int) -> NicPlan:
    where = f"nics[{i}]"
    if not isinstance(value, dict):
        raise ArgError(f"{where}: must be an object with name, interface, address and peers")
    unknown = sorted(set(value) - NIC_KEYS)
    if unknown:
        raise ArgError(f"{where}.{unknown[0]}: unknown key (a NIC has {', '.join(sorted(NIC_KEYS))})")
    for key in ("name", "address"):
        if key not in value:
            raise ArgError(f"{where}.{key}: required")
    name = _name(value["name"], f"{where}.name")
    iface = value.get("interface")
    if iface is not None and (not isinstance(iface, str) or not IFNAME_RE.match(iface)):
        raise ArgError(f"{where}.interface: {iface!r} is not an interface name (1-15 characters)")
    address = _address(value["address"], f"{where}.address")
    peers = value.get("peers", [])
    if not isinstance(peers, list):
        raise ArgError(f"{where}.peers: must be a list of [name, address]")
    if len(peers) > MAX_PEERS_PER_NIC:
        raise ArgError(f"{where}.peers: {len(peers)} peers; at most {MAX_PEERS_PER_NIC} per NIC")
    out, seen = [], set()
    for k, peer in enumerate(peers):
        pw = f"{where}.peers[{k}]"
        if not isinstance(peer, list) or len(peer) != 2:
            raise ArgError(f"{pw}: must be [name, address]")
        pname = _name(peer[0], f"{pw}[0]")
        paddr = _address(peer[1], f"{pw}[1]")
        if pname == name or paddr == address:
            raise ArgError(f"{pw}: a NIC does not probe itself")
        if pname in seen:
            raise ArgError(f"{pw}[0]: {pname!r} is listed twice")
        seen.add(pname)
        out.append((pname, paddr))
    return NicPlan(name, iface, address, tuple(out))


def _paths(value) -> dict:
    if value is None:
        return dict(PATHS_DEFAULTS)
    if not isinstance(value, dict):
        raise ArgError("paths: must be an object")
    unknown = sorted(set(value) - set(PATHS_DEFAULTS))
    if unknown:
        raise ArgError(f"paths.{unknown[0]}: unknown key (paths has {', '.join(PATHS_DEFAULTS)})")
    out = dict(PATHS_DEFAULTS)
    bounds = {"max_ttl": (1, 32, int), "traces_per_s": (0, 1000, float), "refresh_s": (10, 86400, float),
              "timeout_ms": (10, 5000, float)}
    for key, v in value.items():
        if key == "enabled":
            if not isinstance(v, bool):
                raise ArgError(f"paths.enabled: must be true or false, not {v!r}")
        else:
            lo, hi, typ = bounds[key]
            ok = isinstance(v, int) if typ is int else isinstance(v, (int, float))
            if not ok or isinstance(v, bool) or not lo <= v <= hi:
                raise ArgError(f"paths.{key}: must be {'an integer' if typ is int else 'a number'} "
                               f"between {lo} and {hi}, not {v!r}")
            v = typ(v)
        out[key] = v
    return out


def _routers(value) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ArgError("routers: must be an object of address -> [device, link id or null]")
    if len(value) > MAX_ROUTERS:
        raise ArgError(f"routers: {len(value)} addresses; at most {MAX_ROUTERS}")
    out = {}
    for addr, entry in value.items():
        where = f"routers[{addr!r}]"
        key = _address(addr, where)
        if not isinstance(entry, list) or len(entry) != 2:
            raise ArgError(f"{where}: must be [device, link id or null]")
        device = _name(entry[0], f"{where}[0]")
        link = None if entry[1] is None else _name(entry[1], f"{where}[1]")
        out[key] = (device, link)
    return out


def check(plan: dict) -> dict:
    """The activity's deeper validation: returns the plan with derived values filled in
    (``sport_count``, ``deadline_max_ms``, ``paths``), or raises ArgError naming the field."""
    nics = [_nic(v, i) for i, v in enumerate(plan["nics"])]
    names, addresses = set(), set()
    for i, nic in enumerate(nics):
        if nic.name in names:
            raise ArgError(f"nics[{i}].name: {nic.name!r} is listed twice")
        if nic.address in addresses:
            raise ArgError(f"nics[{i}].address: {nic.address} is listed twice")
        names.add(nic.name)
        addresses.add(nic.address)
    peers = sum(len(n.peers) for n in nics)
    if peers > MAX_PEERS:
        raise ArgError(f"nics: {peers} peers in all; at most {MAX_PEERS}")
    interval = plan["interval_ms"]
    rate = peers * 1000.0 / interval
    if rate > MAX_RATE:
        raise ArgError(f"interval_ms: {peers} peers every {interval:g} ms is {rate:,.0f} probes/s; "
                       f"at most {MAX_RATE:,}")
    window = plan["window_ms"]
    if window < interval:
        raise ArgError(f"window_ms: {window} is shorter than interval_ms {interval:g}")
    if window / interval > MAX_PROBES_PER_WINDOW:
        raise ArgError(f"window_ms: {window / interval:,.0f} probes per peer per window; at most "
                       f"{MAX_PROBES_PER_WINDOW} (lengthen interval_ms or shorten window_ms)")
    count = plan["sport_count"]
    if count is None:
        count = ports_for_paths(plan["ecmp_paths"], plan["coverage"])
        if count > MAX_SPORTS:
            raise ArgError(f"ecmp_paths: {plan['ecmp_paths']} paths at coverage {plan['coverage']} need "
                           f"{count} source ports; at most {MAX_SPORTS} (give sport_count)")
    first = plan["sport_first"]
    if first + count - 1 > 65535:
        raise ArgError(f"sport_count: ports {first}..{first + count - 1} go past 65535")
    if first <= plan["port"] < first + count:
        raise ArgError(f"port: {plan['port']} is inside the source ports {first}..{first + count - 1}")
    if count * len(nics) > MAX_SOCKETS:
        raise ArgError(f"sport_count: {count} ports on {len(nics)} NICs is {count * len(nics)} sockets; "
                       f"at most {MAX_SOCKETS}")
    grace = grace_ms(interval)
    horizon = MASK_HORIZON * interval - grace
    dmax = plan["deadline_max_ms"]
    if dmax is None:
        dmax = max(plan["deadline_floor_ms"], min(200.0, horizon, float(window)))
        if dmax > horizon:
            raise ArgError(f"deadline_floor_ms: {plan['deadline_floor_ms']:g} ms is longer than the "
                           f"{horizon:g} ms a probe can wait at interval_ms {interval:g}")
    elif dmax > horizon:
        raise ArgError(f"deadline_max_ms: {dmax:g}; at interval_ms {interval:g} a probe can wait at most "
                       f"{horizon:g} ms ({MASK_HORIZON} intervals less {grace:g} ms to resolve its direction)")
    if dmax < plan["deadline_floor_ms"]:
        raise ArgError(f"deadline_max_ms: {dmax:g} is below deadline_floor_ms {plan['deadline_floor_ms']:g}")
    if dmax + grace + margin_ms(window) > WINDOWS_IN_FLIGHT * window:
        raise ArgError(f"deadline_max_ms: {dmax:g} ms plus {grace:g} ms to resolve is too long for "
                       f"{window} ms windows")
    out = dict(plan)
    out["sport_count"] = count
    out["deadline_max_ms"] = dmax
    out["paths"] = _paths(plan["paths"])
    _routers(plan["routers"])  # validated here, parsed again by engine_config
    return out


def engine_config(plan: dict) -> EngineConfig:
    """The engine's configuration of a checked plan (``check``'s output)."""
    nics = tuple(_nic(v, i) for i, v in enumerate(plan["nics"]))
    peers = tuple((i, name, addr) for i, nic in enumerate(nics) for name, addr in nic.peers)
    interval = plan["interval_ms"]
    return EngineConfig(
        nics=nics, peers=peers,
        window_ns=int(plan["window_ms"]) * 1_000_000,
        interval_ns=int(round(interval * 1e6)),
        port=int(plan["port"]),
        sport_first=int(plan["sport_first"]),
        sport_count=int(plan["sport_count"]),
        deadline_floor_ns=int(plan["deadline_floor_ms"] * 1e6),
        deadline_k_milli=int(round(plan["deadline_rtt_k"] * 1000)),
        deadline_max_ns=int(plan["deadline_max_ms"] * 1e6),
        grace_ns=int(grace_ms(interval) * 1e6),
        margin_ns=int(margin_ms(int(plan["window_ms"])) * 1e6),
        payload=int(plan["payload_bytes"]),
        dscp=int(plan["dscp"]),
        hw={"software": 0, "auto": 1, "hardware": 2}[plan["timestamps"]],
        txts=1 if plan["tx_timestamps"] else 0,
        paths=dict(plan["paths"]),
        routers=_routers(plan["routers"]),
    )
