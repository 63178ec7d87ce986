"""A cluster on a simulated fabric whose every host is an enrolled, ready node, and its windows
posted the way agents post them: one `probe.window` record per NIC, through the agent endpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.test import Client

from console.fleet.models import Cluster, Node
from console.fleet.services import enroll, import_topology, mark_seen
from testbed.probemesh import records_by_host
from testbed.simulate.topology import TopoParams, generate_topology
from testbed.simulate.window import WindowConfig, simulate
from tests.factories import make_enrollment_token

PARAMS = TopoParams(hosts=8, rails=2, hosts_per_leaf=4, spines=2, links_per_leaf_spine=1)
WINDOW_S = 1.0
T0_NS = 1_796_403_600 * 10**9


@dataclass
class SimCluster:
    cluster: Cluster
    topology: dict
    credentials: dict[str, str]  # host -> node credential
    nodes: dict[str, Node]
    seqs: dict[str, int] = field(default_factory=dict)

    def window(self, faults: str = "none", seed: int = 3, window_s: float = WINDOW_S):
        """One simulated window's observations and its ground truth (same pairs for a seed);
        a probe every 10 ms per pair."""
        scenario = simulate(self.topology, WindowConfig(faults=faults, seed=seed, peers_per_nic=6,
                                                        sent=round(100 * window_s), window_s=window_s, noisy_hosts=0))
        return scenario.observations, scenario.truth

    def post_window(self, observations: dict, index: int, hosts: list[str] | None = None,
                    window_s: float = WINDOW_S) -> list[int]:
        """Post window `index` (start T0 + index windows) as each host's agent would; the status codes."""
        start_ns = T0_NS + index * int(window_s * 1e9)
        by_host = records_by_host(self.topology, observations, start_ns, window_s)
        codes = []
        for host in hosts or sorted(by_host):
            seq = self.seqs[host] = self.seqs.get(host, 0) + 1
            records = [{"kind": "probe.window", "ts": start_ns / 1e9 + window_s + 0.01, "data": r}
                       for r in by_host[host]]
            codes.append(post(self.credentials[host], seq, records).status_code)
        return codes


def post(credential: str, seq: int, records: list[dict]):
    return Client(HTTP_AUTHORIZATION=f"Bearer {credential}").post(
        "/api/v1/agent/telemetry", json.dumps({"seq": seq, "records": records}), content_type="application/json")


def make_sim_cluster(organization, name: str = "sim") -> SimCluster:
    topology = generate_topology(PARAMS, name=f"{organization.slug}-{name}")
    cluster = Cluster.objects.create(organization=organization, name=name)
    import_topology(cluster, topology)
    token = make_enrollment_token(cluster, max_uses=100)
    credentials, nodes = {}, {}
    for host in (h["name"] for h in topology["hosts"]):
        enrolled = enroll(token, {"hostname": host, "machine_id": f"{organization.slug}-{host}"})
        credentials[host] = enrolled.credential
        nodes[host] = mark_seen(enrolled.node)
    return SimCluster(cluster, topology, credentials, nodes)
