"""The console's validation of the ``probe.mesh`` plan (the ``args`` of ``activity.set``).

The agent validates the plan again (``agent/probemesh/plan.py``) and has the last word; this
refuses what it would refuse before anything is stored, naming the field
(``args.nics[0].peers[3][1]``), with the agent's bounds. The contract test
(tests/console/test_probemesh_commands.py) checks that both accept and refuse the same plans.
The plan's size bound is larger than other activities' (a NIC's peers and the router table of
a large fabric).
"""

from __future__ import annotations

import ipaddress
import math
import re

from rest_framework import serializers

from console.commands.activities import register_plan

MAX_NICS = 16
MAX_PEERS_PER_NIC = 512
MAX_PEERS = 8192
MAX_SPORTS = 1024
MAX_SOCKETS = 16384
MAX_RATE = 200_000
MAX_PROBES_PER_WINDOW = 2000
MAX_ROUTERS = 65536
MASK_HORIZON = 60
WINDOWS_IN_FLIGHT = 6
PLAN_MAX_BYTES = 512 * 1024
NAME_RE = re.compile(r'^[!#-\[\]-~]{1,64}$')
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise serializers.ValidationError({where: f"{value!r} is not a name (1-64 printable characters, no "
                                                  "spaces, quotes or backslashes)"})
    return value


def _address(value, where: str) -> str:
    try:
        addr = ipaddress.IPv4Address(value) if isinstance(value, str) else None
    except ValueError:
        addr = None
    if addr is None:
        raise serializers.ValidationError({where: f"{value!r} is not an IPv4 address"})
    if addr.is_multicast or addr.is_unspecified or addr == ipaddress.IPv4Address("255.255.255.255"):
        raise serializers.ValidationError({where: f"{value} cannot be probed (multicast, unspecified or broadcast)"})
    return str(addr)


class Strict(serializers.Serializer):
    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: "unknown key" for key in unknown})
        return super().to_internal_value(data)


class PathSettings(Strict):
    enabled = serializers.BooleanField(required=False)
    max_ttl = serializers.IntegerField(min_value=1, max_value=32, required=False)
    traces_per_s = serializers.FloatField(min_value=0, max_value=1000, required=False)
    refresh_s = serializers.FloatField(min_value=10, max_value=86400, required=False)
    timeout_ms = serializers.FloatField(min_value=10, max_value=5000, required=False)

    def to_internal_value(self, data):
        if isinstance(data, dict) and "enabled" in data and not isinstance(data["enabled"], bool):
            raise serializers.ValidationError({"enabled": "must be true or false"})
        return super().to_internal_value(data)


class ProbeMeshPlan(Strict):
    nics = serializers.ListField(child=serializers.JSONField(), max_length=MAX_NICS, required=False)
    interval_ms = serializers.FloatField(min_value=1.0, max_value=10000.0, required=False)
    window_ms = serializers.IntegerField(min_value=100, max_value=10000, required=False)
    port = serializers.IntegerField(min_value=1, max_value=65535, required=False)
    sport_first = serializers.IntegerField(min_value=1024, max_value=65535, required=False)
    sport_count = serializers.IntegerField(min_value=1, max_value=MAX_SPORTS, required=False, allow_null=True)
    ecmp_paths = serializers.IntegerField(min_value=1, max_value=4096, required=False)
    coverage = serializers.FloatField(min_value=0.5, max_value=0.999999, required=False)
    deadline_floor_ms = serializers.FloatField(min_value=0.1, max_value=1000.0, required=False)
    deadline_rtt_k = serializers.FloatField(min_value=1.0, max_value=100.0, required=False)
    deadline_max_ms = serializers.FloatField(min_value=0.1, max_value=1000.0, required=False, allow_null=True)
    payload_bytes = serializers.IntegerField(min_value=0, max_value=8972, required=False)
    dscp = serializers.IntegerField(min_value=0, max_value=63, required=False)
    timestamps = serializers.ChoiceField(("auto", "software", "hardware"), required=False)
    tx_timestamps = serializers.BooleanField(required=False)
    engine = serializers.ChoiceField(("auto", "native", "python"), required=False)
    paths = PathSettings(required=False, allow_null=True)

    def to_internal_value(self, data):
        if isinstance(data, dict) and "tx_timestamps" in data and not isinstance(data["tx_timestamps"], bool):
            raise serializers.ValidationError({"tx_timestamps": "must be true or false"})
        return super().to_internal_value(data)
    routers = serializers.DictField(child=serializers.JSONField(), required=False, allow_null=True,
                                    allow_empty=True)

    def validate_nics(self, nics):
        names, addresses, total = set(), set(), 0
        for i, nic in enumerate(nics):
            where = f"nics[{i}]"
            if not isinstance(nic, dict):
                raise serializers.ValidationError({where: "must be an object with name, interface, address and peers"})
            unknown = sorted(set(nic) - {"name", "interface", "address", "peers"})
            if unknown:
                raise serializers.ValidationError({f"{where}.{unknown[0]}": "unknown key"})
            for key in ("name", "address"):
                if key not in nic:
                    raise serializers.ValidationError({f"{where}.{key}": "required"})
            name = _name(nic["name"], f"{where}.name")
            iface = nic.get("interface")
            if iface is not None and (not isinstance(iface, str) or not IFNAME_RE.match(iface)):
                raise serializers.ValidationError({f"{where}.interface": f"{iface!r} is not an interface name"})
            address = _address(nic["address"], f"{where}.address")
            if name in names:
                raise serializers.ValidationError({f"{where}.name": f"{name!r} is listed twice"})
            if address in addresses:
                raise serializers.ValidationError({f"{where}.address": f"{address} is listed twice"})
            names.add(name)
            addresses.add(address)
            peers = nic.get("peers", [])
            if not isinstance(peers, list):
                raise serializers.ValidationError({f"{where}.peers": "must be a list of [name, address]"})
            if len(peers) > MAX_PEERS_PER_NIC:
                raise serializers.ValidationError(
                    {f"{where}.peers": f"{len(peers)} peers; at most {MAX_PEERS_PER_NIC} per NIC"})
            seen = set()
            for k, peer in enumerate(peers):
                pw = f"{where}.peers[{k}]"
                if not isinstance(peer, list) or len(peer) != 2:
                    raise serializers.ValidationError({pw: "must be [name, address]"})
                pname, paddr = _name(peer[0], f"{pw}[0]"), _address(peer[1], f"{pw}[1]")
                if pname == name or paddr == address:
                    raise serializers.ValidationError({pw: "a NIC does not probe itself"})
                if pname in seen:
                    raise serializers.ValidationError({f"{pw}[0]": f"{pname!r} is listed twice"})
                seen.add(pname)
            total += len(peers)
        if total > MAX_PEERS:
            raise serializers.ValidationError(f"{total} peers in all; at most {MAX_PEERS}")
        return nics

    def validate_routers(self, routers):
        if routers is None:
            return routers
        if len(routers) > MAX_ROUTERS:
            raise serializers.ValidationError(f"{len(routers)} addresses; at most {MAX_ROUTERS}")
        for addr, entry in routers.items():
            where = f"routers[{addr!r}]"
            _address(addr, where)
            if not isinstance(entry, list) or len(entry) != 2:
                raise serializers.ValidationError({where: "must be [device, link id or null]"})
            _name(entry[0], f"{where}[0]")
            if entry[1] is not None:
                _name(entry[1], f"{where}[1]")
        return routers

    def validate(self, attrs):
        get = attrs.get
        interval, window = get("interval_ms", 10.0), get("window_ms", 1000)
        peers = sum(len(n.get("peers", [])) for n in get("nics", []))
        rate = peers * 1000.0 / interval
        if rate > MAX_RATE:
            raise serializers.ValidationError(
                {"interval_ms": f"{peers} peers every {interval:g} ms is {rate:,.0f} probes/s; at most {MAX_RATE:,}"})
        if window < interval:
            raise serializers.ValidationError({"window_ms": f"{window} is shorter than interval_ms {interval:g}"})
        if window / interval > MAX_PROBES_PER_WINDOW:
            raise serializers.ValidationError(
                {"window_ms": f"{window / interval:,.0f} probes per peer per window; at most {MAX_PROBES_PER_WINDOW}"})
        count = get("sport_count")
        if count is None:
            count = ports_for_paths(get("ecmp_paths", 16), get("coverage", 0.99))
            if count > MAX_SPORTS:
                raise serializers.ValidationError(
                    {"ecmp_paths": f"{get('ecmp_paths', 16)} paths at coverage {get('coverage', 0.99)} need {count} "
                                   f"source ports; at most {MAX_SPORTS} (give sport_count)"})
        first, port = get("sport_first", 40000), get("port", 31901)
        if first + count - 1 > 65535:
            raise serializers.ValidationError({"sport_count": f"ports {first}..{first + count - 1} go past 65535"})
        if first <= port < first + count:
            raise serializers.ValidationError({"port": f"{port} is inside the source ports {first}..{first + count - 1}"})
        if count * len(get("nics", [])) > MAX_SOCKETS:
            raise serializers.ValidationError({"sport_count": f"{count * len(get('nics', []))} sockets; at most "
                                                              f"{MAX_SOCKETS}"})
        grace = min(200.0, max(20.0, 4 * interval))
        horizon = MASK_HORIZON * interval - grace
        floor, dmax = get("deadline_floor_ms", 5.0), get("deadline_max_ms")
        if dmax is None:
            dmax = max(floor, min(200.0, horizon, float(window)))
            if dmax > horizon:
                raise serializers.ValidationError(
                    {"deadline_floor_ms": f"{floor:g} ms is longer than the {horizon:g} ms a probe can wait"})
        elif dmax > horizon:
            raise serializers.ValidationError(
                {"deadline_max_ms": f"{dmax:g}; at interval_ms {interval:g} a probe can wait at most {horizon:g} ms"})
        if dmax < floor:
            raise serializers.ValidationError({"deadline_max_ms": f"{dmax:g} is below deadline_floor_ms {floor:g}"})
        if dmax + grace + min(50.0, window / 4) > WINDOWS_IN_FLIGHT * window:
            raise serializers.ValidationError({"deadline_max_ms": f"{dmax:g} ms is too long for {window} ms windows"})
        return attrs


def ports_for_paths(paths: int, coverage: float) -> int:
    """The fewest source ports reaching each of `paths` ECMP paths with probability `coverage`."""
    def p_all(n: int) -> float:
        return sum((-1) ** j * math.comb(paths, j) * (1 - j / paths) ** n for j in range(paths + 1))

    if paths <= 1:
        return 1
    n = paths
    while p_all(n) < coverage and n < 1 << 20:
        n += max(1, n // 64)
    while n > paths and p_all(n - 1) >= coverage:
        n -= 1
    return n


register_plan("probe.mesh", ProbeMeshPlan, max_bytes=PLAN_MAX_BYTES)
