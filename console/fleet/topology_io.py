"""Import and export a cluster's fabric as `lockstep.topology/v1`.

An import replaces the cluster's declared fabric in one transaction: rows are matched by name
and updated in place (ids, health and what agents reported survive a re-import), new ones are
created, and declared rows the document no longer names are deleted, except nodes and NICs
that agents have reported, which stay as undeclared. Validation runs before anything is
written, so a rejected document changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from console.core.limits import check_columns
from console.fleet.events import cluster_changed
from console.fleet.models import Cluster, Link, Nic, Node, Switch
from console.live.publish import publish
from workers.fabric.topology import FORMAT, Topology, parse_topology

BATCH = 2000


@dataclass
class ImportSummary:
    created: dict[str, int] = field(default_factory=lambda: {"hosts": 0, "switches": 0, "nics": 0, "links": 0})
    updated: dict[str, int] = field(default_factory=lambda: {"hosts": 0, "switches": 0, "nics": 0, "links": 0})
    deleted: dict[str, int] = field(default_factory=lambda: {"hosts": 0, "switches": 0, "nics": 0, "links": 0})

    def as_dict(self) -> dict:
        return {"created": self.created, "updated": self.updated, "deleted": self.deleted}


def nic_device(nic_name: str, host: str) -> str:
    """The interface name a topology NIC stands for: `node000/nic0` on node000 is `nic0`."""
    prefix = f"{host}/"
    return nic_name[len(prefix):] if nic_name.startswith(prefix) else nic_name


def import_topology(cluster: Cluster, document) -> ImportSummary:
    """Validate and store a topology document (raises TopologyError naming every problem)."""
    topology = parse_topology(document)
    check_columns(_column_checks(topology))
    with transaction.atomic():
        Cluster.objects.select_for_update().filter(pk=cluster.pk).first()  # one import at a time
        summary = ImportSummary()
        # Deleting a host cascades to its NICs and cables, so count those deletions by name.
        nics_before = set(Nic.objects.filter(cluster=cluster).values_list("name", flat=True))
        links_before = set(Link.objects.filter(cluster=cluster).values_list("name", flat=True))
        nodes = _import_hosts(cluster, topology, summary)
        switches = _import_switches(cluster, topology, summary)
        nics = _import_nics(cluster, topology, nodes, summary)
        _import_links(cluster, topology, nics, switches, summary)
        summary.deleted["nics"] = len(nics_before - set(Nic.objects.filter(cluster=cluster).values_list("name", flat=True)))
        summary.deleted["links"] = len(links_before - {link.id for link in topology.links})
        cluster.topology_name = topology.name
        cluster.topology_imported_at = timezone.now()
        cluster.save(update_fields=["topology_name", "topology_imported_at", "updated"])
        publish(cluster.organization_id, cluster.pk, "topology", {"id": cluster.pk, **summary.as_dict()})
        cluster_changed(cluster.organization_id, cluster.pk, topology_name=topology.name)
    return summary


def _column_checks(topology: Topology):
    """Every value of the document bound for a column, with where it is in the document."""
    yield "name", Cluster, "topology_name", topology.name
    for i, host in enumerate(topology.hosts):
        yield f"hosts[{i}].name", Node, "name", host.name
    for i, switch in enumerate(topology.switches):
        yield f"switches[{i}].name", Switch, "name", switch.name
        yield f"switches[{i}].tier", Switch, "tier", switch.tier
    for i, nic in enumerate(topology.nics):
        yield f"nics[{i}].name", Nic, "name", nic.name
        yield f"nics[{i}].name", Nic, "device", nic_device(nic.name, nic.host)
        yield f"nics[{i}].rail", Nic, "rail", nic.rail
    for i, link in enumerate(topology.links):
        yield f"links[{i}].id", Link, "name", link.id


def _import_hosts(cluster: Cluster, topology: Topology, summary: ImportSummary) -> dict[str, Node]:
    existing = {n.name: n for n in Node.objects.filter(cluster=cluster)}
    wanted = {h.name for h in topology.hosts}
    to_create, to_update = [], []
    for position, host in enumerate(topology.hosts):
        node = existing.get(host.name)
        if node is None:
            to_create.append(
                Node(organization_id=cluster.organization_id, cluster=cluster, name=host.name,
                     in_topology=True, position=position)
            )
        elif not node.in_topology or node.position != position:
            node.in_topology, node.position = True, position
            to_update.append(node)
    Node.objects.bulk_create(to_create, batch_size=BATCH)
    Node.objects.bulk_update(to_update, ["in_topology", "position"], batch_size=BATCH)
    gone = [n for name, n in existing.items() if name not in wanted and n.in_topology]
    never_enrolled = [n.pk for n in gone if n.enrolled_at is None]
    Node.objects.filter(pk__in=never_enrolled).delete()
    Node.objects.filter(pk__in=[n.pk for n in gone if n.enrolled_at is not None]).update(in_topology=False)
    summary.created["hosts"], summary.updated["hosts"], summary.deleted["hosts"] = (
        len(to_create), len(to_update), len(never_enrolled)
    )
    return {n.name: n for n in Node.objects.filter(cluster=cluster, name__in=wanted)}


def _import_switches(cluster: Cluster, topology: Topology, summary: ImportSummary) -> dict[str, Switch]:
    existing = {s.name: s for s in Switch.objects.filter(cluster=cluster)}
    to_create, to_update = [], []
    for position, declared in enumerate(topology.switches):
        switch = existing.pop(declared.name, None)
        if switch is None:
            to_create.append(
                Switch(organization_id=cluster.organization_id, cluster=cluster, name=declared.name,
                       tier=declared.tier, position=position)
            )
        elif switch.tier != declared.tier or switch.position != position:
            switch.tier, switch.position = declared.tier, position
            to_update.append(switch)
    Switch.objects.bulk_create(to_create, batch_size=BATCH)
    Switch.objects.bulk_update(to_update, ["tier", "position"], batch_size=BATCH)
    Switch.objects.filter(pk__in=[s.pk for s in existing.values()]).delete()
    summary.created["switches"], summary.updated["switches"], summary.deleted["switches"] = (
        len(to_create), len(to_update), len(existing)
    )
    return {s.name: s for s in Switch.objects.filter(cluster=cluster)}


def _import_nics(cluster: Cluster, topology: Topology, nodes: dict[str, Node], summary: ImportSummary) -> dict[str, Nic]:
    existing = list(Nic.objects.filter(cluster=cluster))
    by_name = {n.name: n for n in existing}
    by_device = {(n.node_id, n.device): n for n in existing if not n.in_topology}
    claimed: set[int] = set()
    to_create, to_update = [], []
    for position, declared in enumerate(topology.nics):
        node = nodes[declared.host]
        device = nic_device(declared.name, declared.host)
        # A NIC an agent already reported under its device name is adopted, not duplicated.
        nic = by_name.get(declared.name) or by_device.get((node.pk, device))
        if nic is None:
            to_create.append(
                Nic(organization_id=cluster.organization_id, cluster=cluster, node=node, name=declared.name,
                    device=device, rail=declared.rail, in_topology=True, position=position)
            )
            continue
        claimed.add(nic.pk)
        fields = (declared.name, node.pk, device, declared.rail, True, position)
        if (nic.name, nic.node_id, nic.device, nic.rail, nic.in_topology, nic.position) != fields:
            nic.name, nic.node_id, nic.device, nic.rail, nic.in_topology, nic.position = fields
            to_update.append(nic)
    gone = [n for n in existing if n.in_topology and n.pk not in claimed]
    reported = [n.pk for n in gone if n.mac or n.guid or n.pci_address]
    dropped = [n.pk for n in gone if n.pk not in set(reported)]
    # Free the names of dropped rows before renamed ones take them.
    Nic.objects.filter(pk__in=dropped).delete()
    Nic.objects.filter(pk__in=reported).update(in_topology=False, rail=None)
    Nic.objects.bulk_update(to_update, ["name", "node", "device", "rail", "in_topology", "position"], batch_size=BATCH)
    Nic.objects.bulk_create(to_create, batch_size=BATCH)
    summary.created["nics"], summary.updated["nics"] = len(to_create), len(to_update)
    return {n.name: n for n in Nic.objects.filter(cluster=cluster, in_topology=True)}


def _import_links(cluster, topology: Topology, nics: dict[str, Nic], switches: dict[str, Switch],
                  summary: ImportSummary) -> None:
    existing = {link.name: link for link in Link.objects.filter(cluster=cluster)}
    to_create, to_update = [], []

    def ends(name: str) -> tuple[int | None, int | None]:
        nic = nics.get(name)
        return (nic.pk, None) if nic is not None else (None, switches[name].pk)

    for position, declared in enumerate(topology.links):
        a_nic, a_switch = ends(declared.a)
        b_nic, b_switch = ends(declared.b)
        fields = (a_nic, a_switch, b_nic, b_switch, position)
        link = existing.pop(declared.id, None)
        if link is None:
            to_create.append(
                Link(organization_id=cluster.organization_id, cluster=cluster, name=declared.id,
                     a_nic_id=a_nic, a_switch_id=a_switch, b_nic_id=b_nic, b_switch_id=b_switch, position=position)
            )
        elif (link.a_nic_id, link.a_switch_id, link.b_nic_id, link.b_switch_id, link.position) != fields:
            link.a_nic_id, link.a_switch_id, link.b_nic_id, link.b_switch_id, link.position = fields
            to_update.append(link)
    Link.objects.filter(pk__in=[link.pk for link in existing.values()]).delete()
    Link.objects.bulk_update(to_update, ["a_nic", "a_switch", "b_nic", "b_switch", "position"], batch_size=BATCH)
    Link.objects.bulk_create(to_create, batch_size=BATCH)
    summary.created["links"], summary.updated["links"] = len(to_create), len(to_update)


def export_topology(cluster: Cluster) -> dict:
    """The cluster's declared fabric as a `lockstep.topology/v1` document (plain rows: a 9,216-GPU
    fabric is ~35k of them)."""
    hosts = Node.objects.filter(cluster=cluster, in_topology=True).order_by("position", "name")
    switches = Switch.objects.filter(cluster=cluster).order_by("position", "name")
    nics = Nic.objects.filter(cluster=cluster, in_topology=True).order_by("position", "name")
    links = Link.objects.filter(cluster=cluster).order_by("position", "name")
    return {
        "format": FORMAT,
        # A cluster without a topology exports under its own name, made a topology name (no
        # spaces), so the document always parses back (paths, re-import).
        "name": cluster.topology_name or "-".join(cluster.name.split()) or "cluster",
        "hosts": [{"name": name} for name in hosts.values_list("name", flat=True)],
        "switches": [{"name": name, "tier": tier} for name, tier in switches.values_list("name", "tier")],
        "nics": [
            {"name": name, "host": host} | ({"rail": rail} if rail is not None else {})
            for name, host, rail in nics.values_list("name", "node__name", "rail")
        ],
        "links": [
            {"id": name, "a": a_nic or a_switch, "b": b_nic or b_switch}
            for name, a_nic, a_switch, b_nic, b_switch in links.values_list(
                "name", "a_nic__name", "a_switch__name", "b_nic__name", "b_switch__name"
            )
        ],
    }
