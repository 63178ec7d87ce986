"""Console side of the audit's agent commands (``agent/audit/commands.py``): argument serializers
that validate what the console sends, with the agent's bounds, and the types' timeouts.

Results are not applied here: the audits app (phase 2) reads each command's result
(``lockstep.audit.node/v1``, ``lockstep.audit.load/v1``, ``lockstep.audit.collective/v1``).
Every serializer refuses unknown keys, naming them, as the agent does.
"""

from __future__ import annotations

import re

from rest_framework import serializers

from console.commands.registry import CommandType, register

SECTIONS = ("gpu", "pcie", "affinity", "nic", "host")
HARDWARE = ("h100-sxm", "h200-sxm", "a100-sxm", "generic")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce")


class Strict(serializers.Serializer):
    """A serializer that refuses keys it does not declare (the agent refuses them too)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: "unknown argument" for key in unknown})
        return super().to_internal_value(data)


class Rail(Strict):
    rail = serializers.IntegerField(min_value=0, max_value=63)
    nic = serializers.CharField(max_length=64)
    gpu = serializers.IntegerField(min_value=0, max_value=63, required=False)


class NicExpectation(Strict):
    device = serializers.CharField(max_length=64)
    rail = serializers.IntegerField(min_value=0, max_value=63, required=False)
    mtu = serializers.IntegerField(min_value=68, max_value=65536, required=False)
    speed_mbps = serializers.IntegerField(min_value=1, required=False)
    firmware = serializers.CharField(max_length=64, required=False)


class HostExpectation(Strict):
    kernel = serializers.CharField(max_length=200, required=False)
    os = serializers.CharField(max_length=200, required=False)
    gpu_driver = serializers.CharField(max_length=64, required=False)
    cuda_driver = serializers.CharField(max_length=16, required=False)
    cuda_toolkit = serializers.CharField(max_length=16, required=False)
    nccl = serializers.ListField(child=serializers.CharField(max_length=32), max_length=16, required=False)
    hugepages_total = serializers.IntegerField(min_value=0, required=False)
    hugepage_size_kb = serializers.IntegerField(min_value=0, required=False)
    transparent_hugepages = serializers.ChoiceField(("always", "madvise", "never"), required=False)
    nic_drivers = serializers.ListField(child=serializers.CharField(max_length=128), max_length=32, required=False)
    nic_firmware = serializers.ListField(child=serializers.CharField(max_length=64), max_length=32, required=False)
    gpu_models = serializers.ListField(child=serializers.CharField(max_length=128), max_length=8, required=False)
    gpu_count = serializers.IntegerField(min_value=0, max_value=64, required=False)


class NodeCheckArgs(Strict):
    sections = serializers.ListField(child=serializers.ChoiceField(SECTIONS), min_length=1, max_length=len(SECTIONS),
                                     required=False)
    hardware = serializers.ChoiceField(HARDWARE, required=False)
    expected_gpus = serializers.IntegerField(min_value=0, max_value=64, required=False)
    listen_ms = serializers.IntegerField(min_value=0, max_value=30000, required=False)
    rails = serializers.ListField(child=Rail(), max_length=64, required=False)
    nics = serializers.ListField(child=NicExpectation(), max_length=256, required=False)
    mtu = serializers.IntegerField(min_value=68, max_value=65536, required=False)
    speed_mbps = serializers.IntegerField(min_value=1, required=False)
    expect = HostExpectation(required=False)


class GpuArgs(Strict):
    hardware = serializers.ChoiceField(HARDWARE, required=False)
    expected_gpus = serializers.IntegerField(min_value=0, max_value=64, required=False)
    listen_ms = serializers.IntegerField(min_value=0, max_value=30000, required=False)


class PcieArgs(Strict):
    hardware = serializers.ChoiceField(HARDWARE, required=False)
    nics = serializers.ListField(child=NicExpectation(), max_length=256, required=False)


class AffinityArgs(Strict):
    rails = serializers.ListField(child=Rail(), max_length=64, required=False)


class NicArgs(Strict):
    hardware = serializers.ChoiceField(HARDWARE, required=False)
    nics = serializers.ListField(child=NicExpectation(), max_length=256, required=False)
    mtu = serializers.IntegerField(min_value=68, max_value=65536, required=False)
    speed_mbps = serializers.IntegerField(min_value=1, required=False)


class HostArgs(Strict):
    expect = HostExpectation(required=False)


class LoadFlow(Strict):
    id = serializers.IntegerField(min_value=0)
    src = serializers.CharField(max_length=200)
    src_addr = serializers.IPAddressField(protocol="IPv4")
    device = serializers.CharField(max_length=15, required=False)
    dst = serializers.CharField(max_length=200)
    dst_addr = serializers.IPAddressField(protocol="IPv4")
    sport = serializers.IntegerField(min_value=1024, max_value=65535)
    dport = serializers.IntegerField(min_value=1024, max_value=65535)
    rate_mbit = serializers.FloatField(min_value=0)


class ListenFlow(Strict):
    id = serializers.IntegerField(min_value=0)
    src = serializers.CharField(max_length=200)


class Listener(Strict):
    nic = serializers.CharField(max_length=200)
    addr = serializers.IPAddressField(protocol="IPv4")
    device = serializers.CharField(max_length=15, required=False)
    port = serializers.IntegerField(min_value=1024, max_value=65535)
    flows = serializers.ListField(child=ListenFlow(), max_length=4096)


class LoadArgs(Strict):
    run = serializers.IntegerField(min_value=0, max_value=2**32 - 1)
    start_at = serializers.FloatField()
    duration_s = serializers.FloatField(min_value=0.1, max_value=600)
    window_s = serializers.FloatField(min_value=0.1, max_value=60, required=False)
    grace_s = serializers.FloatField(min_value=0, max_value=30, required=False)
    packet_bytes = serializers.IntegerField(min_value=24, max_value=65000, required=False)
    protocol = serializers.ChoiceField(("udp", "tcp"), required=False)
    trace_ttl = serializers.IntegerField(min_value=0, max_value=64, required=False)
    trace_extra = serializers.IntegerField(min_value=0, max_value=16, required=False)
    flows = serializers.ListField(child=LoadFlow(), max_length=4096, required=False)
    listen = serializers.ListField(child=Listener(), max_length=256, required=False)

    def validate(self, attrs):
        ids = [f["id"] for f in attrs.get("flows", [])]
        if len(ids) != len(set(ids)):
            raise serializers.ValidationError({"flows": "flow ids must be unique"})
        if attrs.get("protocol", "udp") == "udp":
            for i, f in enumerate(attrs.get("flows", [])):
                if f["rate_mbit"] <= 0:
                    raise serializers.ValidationError({f"flows[{i}].rate_mbit": "UDP flows need a positive rate"})
        return attrs


class CollectiveArgs(Strict):
    init = serializers.RegexField(r"^tcp://(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:]+\]):\d{1,5}$", max_length=200)
    world_size = serializers.IntegerField(min_value=1, max_value=65536)
    rank_offset = serializers.IntegerField(min_value=0, required=False)
    local_ranks = serializers.IntegerField(min_value=1, max_value=64, required=False)
    backend = serializers.ChoiceField(("gloo", "nccl"), required=False)
    op = serializers.ChoiceField(OPS, required=False)
    sizes = serializers.ListField(child=serializers.IntegerField(min_value=8), min_length=1, max_length=32,
                                  required=False)
    iters = serializers.IntegerField(min_value=1, max_value=10000, required=False)
    warmup = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    dtype = serializers.ChoiceField(("float32", "float16", "bfloat16", "float64"), required=False)
    ifname = serializers.CharField(max_length=15, required=False)
    env = serializers.DictField(child=serializers.CharField(max_length=256), required=False)
    hardware = serializers.ChoiceField(HARDWARE, required=False)
    threshold = serializers.ChoiceField(("all_reduce_intra_node_busbw_gbs", "per_nic_busbw_gbs"), required=False)
    min_busbw_gbs = serializers.FloatField(min_value=0, required=False)
    timeout_s = serializers.FloatField(min_value=1, max_value=3600, required=False)

    def validate_env(self, value):
        for key in value:
            if not re.match(r"^(NCCL|GLOO)_[A-Z0-9_]+$", key):
                raise serializers.ValidationError(f"{key!r} is not an NCCL_* or GLOO_* setting")
        return value

    def validate(self, attrs):
        if attrs.get("rank_offset", 0) + attrs.get("local_ranks", 1) > attrs["world_size"]:
            raise serializers.ValidationError({"rank_offset": "this node's ranks do not fit in world_size"})
        port = int(attrs["init"].rsplit(":", 1)[1])
        if not 0 < port < 65536:
            raise serializers.ValidationError({"init": "the port must be below 65536"})
        return attrs


for _name, _description, _serializer, _timeout in (
    ("audit.node", "Audit the node: GPU, PCIe, GPU-NIC affinity, NIC and host checks with evidence.", NodeCheckArgs, 120),
    ("audit.gpu", "Audit the GPUs: ECC, row remaps, Xids, clocks, temperature, power, NVLink, fabric.", GpuArgs, 60),
    ("audit.pcie", "Audit PCIe links, replays, AER and ACS of GPUs, NICs and switch ports.", PcieArgs, 30),
    ("audit.affinity", "Audit GPU-NIC PCIe affinity against the rail layout.", AffinityArgs, 30),
    ("audit.nic", "Audit NIC link state, speed, MTU, firmware and error counters.", NicArgs, 30),
    ("audit.host", "Audit clock sync and the host facts the fleet must agree on.", HostArgs, 30),
    ("audit.load", "Send and receive the traffic plan's flows at start_at; throughput, loss and delay.", LoadArgs, 900),
    ("audit.collective", "Run this node's ranks of a collective; bus bandwidth as nccl-tests.", CollectiveArgs, 3600),
):
    register(CommandType(name=_name, description=_description, args_serializer=_serializer, timeout_s=_timeout))
