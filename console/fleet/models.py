"""The fleet: clusters, their nodes (hosts), GPUs, NICs, switches and the cables between them.

A cluster's fabric comes from a `lockstep.topology/v1` import (hosts, switches, NICs, links,
`in_topology=True`) and from what enrolled agents report (GPUs, host facts, and NICs the
topology does not name, `in_topology=False`). A topology host is a `Node` waiting in state
`enrolling` until its agent enrolls under the same host name.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from console.core.models import ClusterOwnedModel, Health, OrganizationOwnedModel
from console.core.tokens import HashedToken

__all__ = [
    "Cluster",
    "EnrollmentToken",
    "Gpu",
    "Link",
    "Nic",
    "Node",
    "NodeCredential",
    "NodeState",
    "Switch",
]


class Cluster(OrganizationOwnedModel):
    """A GPU cluster: one fabric and the nodes on it."""

    name = models.CharField(
        verbose_name="name",
        max_length=100,
    )
    description = models.CharField(
        verbose_name="description",
        max_length=500,
        blank=True,
    )
    topology_name = models.CharField(
        verbose_name="topology name",
        max_length=200,
        blank=True,
        help_text="The `name` of the last imported lockstep.topology/v1 document.",
    )
    topology_imported_at = models.DateTimeField(
        verbose_name="topology imported at",
        null=True,
        blank=True,
    )

    class Meta:
        ordering = ["organization", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["organization", "name"], name="fleet_cluster_unique_organization_name"
            ),
            # What children's composite foreign keys reference (console.core.models: placement).
            models.UniqueConstraint(fields=["id", "organization"], name="fleet_cluster_unique_id_organization"),
        ]

    def __str__(self) -> str:
        return self.name


class NodeState(models.TextChoices):
    ENROLLING = "enrolling", "Enrolling"  # declared or enrolled, agent not yet heard from
    READY = "ready", "Ready"  # agent heard from within the lost-after window
    LOST = "lost", "Lost"  # agent silent for longer than the window
    DRAINING = "draining", "Draining"  # operator took it out of service; agent still runs
    RETIRED = "retired", "Retired"  # gone for good; credentials revoked


NODE_STATE_HEALTH = {
    NodeState.ENROLLING: Health.UNKNOWN,
    NodeState.READY: Health.OK,
    NodeState.LOST: Health.DOWN,
    NodeState.DRAINING: Health.DEGRADED,
    NodeState.RETIRED: Health.UNKNOWN,
}


class Node(ClusterOwnedModel):
    """A server in a cluster, and the agent that runs on it."""

    name = models.CharField(
        verbose_name="name",
        max_length=200,
    )
    hostname = models.CharField(
        verbose_name="hostname",
        max_length=255,
        blank=True,
    )
    machine_id = models.CharField(
        verbose_name="machine id",
        max_length=64,
        blank=True,
    )
    state = models.CharField(
        verbose_name="state",
        max_length=16,
        choices=NodeState.choices,
        default=NodeState.ENROLLING,
    )
    state_changed = models.DateTimeField(
        verbose_name="state changed",
        auto_now_add=True,
    )
    last_seen = models.DateTimeField(
        verbose_name="last seen",
        null=True,
        blank=True,
    )
    enrolled_at = models.DateTimeField(
        verbose_name="enrolled at",
        null=True,
        blank=True,
    )
    agent_version = models.CharField(
        verbose_name="agent version",
        max_length=50,
        blank=True,
    )
    facts = models.JSONField(
        verbose_name="host facts",
        default=dict,
        blank=True,
        help_text="Kernel, OS, CPU, memory as the agent reported them.",
    )
    agent_status = models.JSONField(
        verbose_name="agent status",
        default=dict,
        blank=True,
        help_text="The last heartbeat: uptime, telemetry buffered and dropped, commands running.",
    )
    inventory = models.JSONField(
        verbose_name="inventory",
        default=dict,
        blank=True,
        help_text="The last lockstep.inventory/v1 document.",
    )
    inventory_at = models.DateTimeField(
        verbose_name="inventory collected at",
        null=True,
        blank=True,
    )
    health_report = models.JSONField(
        verbose_name="health report",
        default=dict,
        blank=True,
        help_text="The last node.health command result.",
    )
    health_report_at = models.DateTimeField(
        verbose_name="health report at",
        null=True,
        blank=True,
    )
    telemetry_seq = models.BigIntegerField(
        verbose_name="last telemetry sequence number",
        default=0,
    )
    telemetry_dropped = models.BigIntegerField(
        verbose_name="telemetry records dropped by the agent",
        default=0,
    )
    in_topology = models.BooleanField(
        verbose_name="in topology",
        default=False,
    )
    position = models.PositiveIntegerField(
        verbose_name="position in topology",
        default=0,
    )

    class Meta:
        ordering = ["cluster", "position", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="fleet_node_unique_cluster_name"),
            models.UniqueConstraint(fields=["id", "cluster", "organization"], name="fleet_node_unique_id_placement"),
        ]
        indexes = [
            models.Index(fields=["state", "last_seen"], name="fleet_node_state_last_seen"),
            models.Index(fields=["cluster", "machine_id"], name="fleet_node_cluster_machine"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def health(self) -> str:
        return NODE_STATE_HEALTH[self.state]


class FabricElement(ClusterOwnedModel):
    """A declared piece of the fabric (switch, NIC, cable): its health as the live map colors it,
    and its position in the imported topology, so an export keeps the document's order."""

    health = models.CharField(
        verbose_name="health",
        max_length=16,
        choices=Health.choices,
        default=Health.UNKNOWN,
    )
    position = models.PositiveIntegerField(
        verbose_name="position in topology",
        default=0,
    )

    class Meta:
        abstract = True


class Switch(FabricElement):
    """A fabric switch (leaf, spine, core...)."""

    name = models.CharField(
        verbose_name="name",
        max_length=200,
    )
    tier = models.CharField(
        verbose_name="tier",
        max_length=50,
        blank=True,
    )

    class Meta:
        ordering = ["cluster", "position", "name"]
        verbose_name_plural = "switches"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="fleet_switch_unique_cluster_name"),
            models.UniqueConstraint(fields=["id", "cluster"], name="fleet_switch_unique_id_cluster"),
        ]

    def __str__(self) -> str:
        return self.name


class NicKind(models.TextChoices):
    ETHERNET = "ethernet", "Ethernet"
    INFINIBAND = "infiniband", "InfiniBand"


class Nic(FabricElement):
    """A network interface of a node. Fabric NICs are named `<host>/<device>` in the topology."""

    tenant_parents = ("node",)

    node = models.ForeignKey(
        to=Node,
        on_delete=models.CASCADE,
        related_name="nics",
        verbose_name="node",
    )
    name = models.CharField(
        verbose_name="name",
        max_length=255,
    )
    device = models.CharField(
        verbose_name="device",
        max_length=64,
        blank=True,
        help_text="The interface name on the host (eth0, ibp24s0, nic0).",
    )
    rail = models.PositiveIntegerField(
        verbose_name="rail",
        null=True,
        blank=True,
    )
    kind = models.CharField(
        verbose_name="kind",
        max_length=16,
        choices=NicKind.choices,
        blank=True,
    )
    mac = models.CharField(
        verbose_name="MAC address",
        max_length=64,
        blank=True,
    )
    guid = models.CharField(
        verbose_name="GUID",
        max_length=64,
        blank=True,
    )
    rdma_device = models.CharField(
        verbose_name="RDMA device",
        max_length=64,
        blank=True,
    )
    pci_address = models.CharField(
        verbose_name="PCI address",
        max_length=32,
        blank=True,
    )
    numa_node = models.IntegerField(
        verbose_name="NUMA node",
        null=True,
        blank=True,
    )
    speed_mbps = models.PositiveBigIntegerField(
        verbose_name="speed (Mb/s)",
        null=True,
        blank=True,
    )
    mtu = models.PositiveIntegerField(
        verbose_name="MTU",
        null=True,
        blank=True,
    )
    link_state = models.CharField(
        verbose_name="link state",
        max_length=16,
        default="unknown",
    )
    addresses = models.JSONField(
        verbose_name="addresses",
        default=list,
        blank=True,
    )
    in_topology = models.BooleanField(
        verbose_name="in topology",
        default=False,
    )

    class Meta:
        ordering = ["cluster", "position", "name"]
        verbose_name = "NIC"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="fleet_nic_unique_cluster_name"),
            models.UniqueConstraint(fields=["id", "cluster"], name="fleet_nic_unique_id_cluster"),
            models.UniqueConstraint(fields=["id", "node"], name="fleet_nic_unique_id_node"),
        ]
        indexes = [models.Index(fields=["node", "device"], name="fleet_nic_node_device")]

    def __str__(self) -> str:
        return self.name


class Gpu(ClusterOwnedModel):
    """A GPU of a node, as NVML reports it."""

    tenant_parents = ("node", "nearest_nic")

    node = models.ForeignKey(
        to=Node,
        on_delete=models.CASCADE,
        related_name="gpus",
        verbose_name="node",
    )
    index = models.PositiveIntegerField(
        verbose_name="index",
    )
    uuid = models.CharField(
        verbose_name="UUID",
        max_length=64,
        blank=True,
    )
    name = models.CharField(
        verbose_name="model name",
        max_length=200,
        blank=True,
    )
    pci_bus_id = models.CharField(
        verbose_name="PCI bus id",
        max_length=32,
        blank=True,
    )
    memory_bytes = models.PositiveBigIntegerField(
        verbose_name="memory (bytes)",
        null=True,
        blank=True,
    )
    driver_version = models.CharField(
        verbose_name="driver version",
        max_length=32,
        blank=True,
    )
    cuda_version = models.CharField(
        verbose_name="CUDA version",
        max_length=16,
        blank=True,
    )
    ecc_enabled = models.BooleanField(
        verbose_name="ECC enabled",
        null=True,
        blank=True,
    )
    numa_node = models.IntegerField(
        verbose_name="NUMA node",
        null=True,
        blank=True,
    )
    nvlinks = models.JSONField(
        verbose_name="NVLink state",
        default=list,
        blank=True,
    )
    nearest_nic = models.ForeignKey(
        to=Nic,
        on_delete=models.SET_NULL,
        related_name="nearest_gpus",
        verbose_name="nearest NIC",
        null=True,
        blank=True,
        help_text="The closest NIC on the PCIe tree (the one NCCL should use for this GPU).",
    )
    affinity = models.JSONField(
        verbose_name="NIC affinity",
        default=list,
        blank=True,
        help_text='[{"nic": device, "relation": "PIX|PXB|PHB|NODE|SYS"}]',
    )
    health = models.CharField(
        verbose_name="health",
        max_length=16,
        choices=Health.choices,
        default=Health.UNKNOWN,
    )

    class Meta:
        ordering = ["node", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="fleet_gpu_unique_node_index"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class Link(FabricElement):
    """A cable between two ends, each a NIC or a switch."""

    tenant_parents = ("a_nic", "a_switch", "b_nic", "b_switch")

    name = models.CharField(
        verbose_name="link id",
        max_length=255,
    )
    a_nic = models.ForeignKey(
        to=Nic, on_delete=models.CASCADE, related_name="+", null=True, blank=True, verbose_name="A end (NIC)"
    )
    a_switch = models.ForeignKey(
        to=Switch, on_delete=models.CASCADE, related_name="+", null=True, blank=True, verbose_name="A end (switch)"
    )
    b_nic = models.ForeignKey(
        to=Nic, on_delete=models.CASCADE, related_name="+", null=True, blank=True, verbose_name="B end (NIC)"
    )
    b_switch = models.ForeignKey(
        to=Switch, on_delete=models.CASCADE, related_name="+", null=True, blank=True, verbose_name="B end (switch)"
    )

    class Meta:
        ordering = ["cluster", "position", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="fleet_link_unique_cluster_name"),
            models.CheckConstraint(
                condition=Q(a_nic__isnull=True) ^ Q(a_switch__isnull=True),
                name="fleet_link_one_a_end",
            ),
            models.CheckConstraint(
                condition=Q(b_nic__isnull=True) ^ Q(b_switch__isnull=True),
                name="fleet_link_one_b_end",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def a_name(self) -> str:
        return (self.a_nic or self.a_switch).name

    @property
    def b_name(self) -> str:
        return (self.b_nic or self.b_switch).name


class EnrollmentToken(HashedToken, ClusterOwnedModel):
    """Lets agents join one cluster: expiring, limited in uses, revocable."""

    PREFIX = "lse"

    description = models.CharField(
        verbose_name="description",
        max_length=200,
        blank=True,
    )
    created_by = models.ForeignKey(
        to=settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        related_name="+",
        null=True,
        blank=True,
        verbose_name="created by",
    )
    max_uses = models.PositiveIntegerField(
        verbose_name="maximum uses",
        null=True,
        blank=True,
        help_text="Empty means unlimited.",
    )
    uses = models.PositiveIntegerField(
        verbose_name="uses",
        default=0,
    )

    class Meta:
        ordering = ["-created"]

    @property
    def is_exhausted(self) -> bool:
        return self.max_uses is not None and self.uses >= self.max_uses


class NodeCredential(HashedToken, ClusterOwnedModel):
    """The secret one node's agent authenticates with; minted by the console at enrollment."""

    tenant_parents = ("node",)

    PREFIX = "lsn"

    node = models.ForeignKey(
        to=Node,
        on_delete=models.CASCADE,
        related_name="credentials",
        verbose_name="node",
    )

    class Meta:
        ordering = ["-created"]
