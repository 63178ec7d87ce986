from __future__ import annotations

from rest_framework import serializers

from api.serializers.base import StrictModelSerializer
from console.fleet import services
from console.fleet.models import Cluster, EnrollmentToken, Gpu, Link, Nic, NicKind, Node, NodeState, Switch
from console.tenancy.models import Organization


class ClusterSerializer(StrictModelSerializer):
    # Resolved in the caller's tenant scope (the default manager): another tenant's id is "does not exist".
    organization = serializers.PrimaryKeyRelatedField(
        queryset=Organization.objects.all(), required=False,
        help_text="Defaults to the token's organization (or your current one).",
    )
    nodes = serializers.SerializerMethodField(help_text="Node counts by state.")

    class Meta:
        model = Cluster
        fields = ["id", "organization", "name", "description", "topology_name", "topology_imported_at", "nodes",
                  "created", "updated"]
        read_only_fields = ["id", "topology_name", "topology_imported_at", "nodes", "created", "updated"]
        validators = []  # (organization, name) is unique: the service checks it, after the default organization

    def get_nodes(self, obj) -> dict[str, int]:
        counts = getattr(obj, "_node_counts", None)
        if counts is None:
            counts = services.node_counts_by_state([obj.pk])[obj.pk]
        return {state: counts[state] for state in NodeState.values}

    def validate(self, attrs):
        if self.instance is not None and "organization" in attrs and attrs["organization"] != self.instance.organization:
            raise serializers.ValidationError({"organization": "a cluster cannot move to another organization"})
        return attrs


class NodeSerializer(StrictModelSerializer):
    health = serializers.CharField(read_only=True)
    gpu_count = serializers.IntegerField(read_only=True, default=None)

    class Meta:
        model = Node
        fields = ["id", "organization", "cluster", "name", "hostname", "machine_id", "state", "health",
                  "state_changed", "last_seen", "enrolled_at", "agent_version", "facts", "agent_status",
                  "health_report", "health_report_at", "in_topology", "inventory_at", "telemetry_seq",
                  "telemetry_dropped", "gpu_count", "created", "updated"]
        read_only_fields = fields


class GpuSerializer(StrictModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    nearest_nic_name = serializers.CharField(source="nearest_nic.name", read_only=True, default=None)

    class Meta:
        model = Gpu
        fields = ["id", "organization", "cluster", "node", "node_name", "index", "uuid", "name", "pci_bus_id",
                  "memory_bytes", "driver_version", "cuda_version", "ecc_enabled", "numa_node", "nvlinks",
                  "nearest_nic", "nearest_nic_name", "affinity", "health", "updated"]
        read_only_fields = fields


class NicSerializer(StrictModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    kind = serializers.ChoiceField(choices=[("", "not reported yet"), *NicKind.choices], read_only=True)

    class Meta:
        model = Nic
        fields = ["id", "organization", "cluster", "node", "node_name", "name", "device", "rail", "kind", "mac",
                  "guid", "rdma_device", "pci_address", "numa_node", "speed_mbps", "mtu", "link_state",
                  "addresses", "in_topology", "health", "updated"]
        read_only_fields = fields


class SwitchSerializer(StrictModelSerializer):
    class Meta:
        model = Switch
        fields = ["id", "organization", "cluster", "name", "tier", "health", "updated"]
        read_only_fields = fields


class LinkSerializer(StrictModelSerializer):
    a = serializers.CharField(source="a_name", read_only=True)
    b = serializers.CharField(source="b_name", read_only=True)

    class Meta:
        model = Link
        fields = ["id", "organization", "cluster", "name", "a", "b", "a_nic", "a_switch", "b_nic", "b_switch",
                  "health", "updated"]
        read_only_fields = fields


class EnrollmentTokenSerializer(StrictModelSerializer):
    prefix = serializers.CharField(source="prefix_display", read_only=True)
    expires_in_s = serializers.IntegerField(
        write_only=True, required=False, min_value=int(services.ENROLLMENT_TOKEN_MIN_TTL.total_seconds()),
        max_value=int(services.ENROLLMENT_TOKEN_MAX_TTL.total_seconds()),
        help_text=f"Lifetime in seconds (default {int(services.ENROLLMENT_TOKEN_TTL.total_seconds())}, "
                  f"{services.ENROLLMENT_TOKEN_TTL}); or give `expires`.",
    )

    class Meta:
        model = EnrollmentToken
        fields = ["id", "organization", "cluster", "description", "prefix", "expires", "expires_in_s", "max_uses",
                  "uses", "last_used", "revoked_at", "created"]
        read_only_fields = ["id", "organization", "cluster", "prefix", "uses", "last_used", "revoked_at", "created"]

    # Defaults and bounds (lifetime, uses) are the service's: console.fleet.services.mint_enrollment_token.


class EnrollmentTokenCreatedSerializer(EnrollmentTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; only its digest is stored.")
    install_command = serializers.CharField(
        read_only=True, help_text="Paste on a node to install and enroll; it asks for the token on the terminal.")
    install_command_token_file = serializers.CharField(
        read_only=True, help_text="The same without a terminal: the token is read from a root-only file on the node "
                                  "(never from the command line, which every user of the node can read).")

    class Meta(EnrollmentTokenSerializer.Meta):
        fields = [*EnrollmentTokenSerializer.Meta.fields, "token", "install_command", "install_command_token_file"]


class TopologySummarySerializer(serializers.Serializer):
    created = serializers.DictField(child=serializers.IntegerField())
    updated = serializers.DictField(child=serializers.IntegerField())
    deleted = serializers.DictField(child=serializers.IntegerField())


class PathsSerializer(serializers.Serializer):
    src = serializers.CharField()
    dst = serializers.CharField()
    hops = serializers.IntegerField(allow_null=True, help_text="Links on a shortest path; null if unreachable.")
    count = serializers.IntegerField(help_text="Number of ECMP paths.")
    paths = serializers.ListField(child=serializers.ListField(child=serializers.CharField()))
    truncated = serializers.BooleanField(help_text="True when more paths exist than `limit` listed.")

