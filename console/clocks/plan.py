"""The console's check of the ``clock.sync`` plan (the ``args`` of ``activity.set``).

The agent checks it again (``agent/clocksync/plan.py``) and has the last word; this refuses what
it would refuse before anything is queued, naming the field under ``args`` (``peers[1][1]``).
"""

from __future__ import annotations

import ipaddress
import math
import re

from rest_framework import serializers

from console.commands.activities import register_plan

MAX_PEERS = 64
NAME_RE = re.compile(r'^[!#-\[\]-~]{1,200}$')
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.:@-]{0,15}$")
MAX_ABS_OFFSET_NS = 3600e9
MAX_ABS_DRIFT_PPM = 1000.0


def _address(value, where: str) -> str:
    try:
        addr = ipaddress.IPv4Address(value) if isinstance(value, str) else None
    except ValueError:
        addr = None
    if addr is None or addr.is_multicast or addr.is_unspecified:
        raise serializers.ValidationError({where: f"{value!r} is not a unicast IPv4 address"})
    return str(addr)


def _name(value, where: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise serializers.ValidationError({where: f"{value!r} is not a node name (1-200 printable characters, "
                                                  "no spaces, quotes or backslashes)"})
    return value


def _number(value, where: str, bound: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or abs(value) > bound:
        raise serializers.ValidationError({where: f"must be a finite number within ±{bound:g}, not {value!r}"})
    return float(value)


class CorrectionSerializer(serializers.Serializer):
    offset_ns = serializers.JSONField()
    drift_ppm = serializers.JSONField()
    sigma_ns = serializers.JSONField()
    t_ref_ns = serializers.IntegerField(min_value=1, max_value=2**63 - 1)
    reference = serializers.JSONField(required=False, default=None)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: "unknown key" for key in unknown})
        return super().to_internal_value(data)

    def validate(self, data):
        sigma = _number(data["sigma_ns"], "sigma_ns", MAX_ABS_OFFSET_NS)
        if sigma < 0:
            raise serializers.ValidationError({"sigma_ns": "must be at least 0"})
        reference = data.get("reference")
        return {"offset_ns": _number(data["offset_ns"], "offset_ns", MAX_ABS_OFFSET_NS),
                "drift_ppm": _number(data["drift_ppm"], "drift_ppm", MAX_ABS_DRIFT_PPM), "sigma_ns": sigma,
                "t_ref_ns": data["t_ref_ns"], "reference": None if reference is None else _name(reference, "reference")}


class ClockSyncPlanSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False, default="", allow_blank=True, trim_whitespace=False)
    address = serializers.CharField(max_length=15, required=False, default="", allow_blank=True)
    interface = serializers.RegexField(IFNAME_RE, required=False, default="", allow_blank=True)
    port = serializers.IntegerField(min_value=1, max_value=65535, required=False, default=31900)
    peers = serializers.ListField(child=serializers.JSONField(), max_length=MAX_PEERS, required=False, default=list)
    rate_hz = serializers.FloatField(min_value=1.0, max_value=2000.0, required=False, default=200.0)
    window_s = serializers.FloatField(min_value=0.5, max_value=30.0, required=False, default=2.0)
    correction = CorrectionSerializer(required=False, allow_null=True, default=None)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: "unknown key" for key in unknown})
        return super().to_internal_value(data)

    def validate(self, data):
        if data["peers"] or data["correction"] is not None:
            _name(data["name"], "name")
            data["address"] = _address(data["address"], "address")
        seen: set[str] = set()
        peers = []
        for i, peer in enumerate(data["peers"]):
            if not isinstance(peer, list) or len(peer) != 2:
                raise serializers.ValidationError({f"peers[{i}]": "must be [name, address]"})
            name = _name(peer[0], f"peers[{i}][0]")
            if name == data["name"] or name in seen:
                raise serializers.ValidationError({f"peers[{i}][0]": "a node itself, or listed twice"})
            seen.add(name)
            peers.append([name, _address(peer[1], f"peers[{i}][1]")])
        data["peers"] = peers
        return data


register_plan("clock.sync", ClockSyncPlanSerializer)
