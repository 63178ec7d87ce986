"""The simulated fleet (testbed/fleet) against a real console process (uvicorn, the test database).

A small fleet enrolls (one node per agent), becomes ready, answers commands sent through the REST
API, and posts telemetry without duplicates; the fleet's own counters match the console's rows.
"""

from __future__ import annotations

from collections import Counter

import pytest
import requests
from django.db.models import Count, Max, Sum

from console.commands.models import Command, CommandState
from console.fleet.models import Cluster, Gpu, Nic, Node, NodeState
from console.telemetry.models import TelemetryBatch, TelemetryRecord
from testbed.fleet import BackgroundFleet, FleetConfig
from testbed.fleet.payloads import hostname, machine_id
from tests.conftest import World
from tests.factories import make_enrollment_token
from tests.integration import conftest as integration
from tests.integration.conftest import wait_until

live_console = integration.live_console  # the console under uvicorn, as in the integration tests
pytestmark = pytest.mark.slow
AGENTS = 20


@pytest.fixture
def world(transactional_db, django_user_model):
    return World(django_user_model)


@pytest.fixture
def cluster(world):
    return Cluster.objects.create(organization=world.acme, name="fleet")


def _config(console: str, token: str, cluster: Cluster, **overrides) -> FleetConfig:
    fields = {"agents": AGENTS, "cluster_id": cluster.pk, "prefix": "sim", "heartbeat_s": 1.0, "poll_wait_s": 5.0,
              "telemetry_every_s": 0.5, "records": 5, "gpus": 2, "rails": 2, "seed": 7}
    return FleetConfig(console=console, token=token, **{**fields, **overrides})


def _running(n: int):
    return lambda snap: snap["agents"]["running"] == n


def test_a_fleet_enrolls_answers_commands_and_its_counters_match_the_console(world, cluster, live_console):
    token = make_enrollment_token(cluster, max_uses=None)  # a fleet of more nodes than the default uses
    api = {"Authorization": f"Bearer {world.token('carol')}"}
    with BackgroundFleet(_config(live_console, token, cluster)) as fleet:
        fleet.wait_for(_running(AGENTS), 120, f"{AGENTS} agents running")
        wait_until(lambda: Node.objects.filter(cluster=cluster, state=NodeState.READY).count() == AGENTS, 30,
                   "every node ready")
        nodes = {n.name: n for n in Node.objects.filter(cluster=cluster)}
        assert sorted(nodes) == [hostname("sim", i) for i in range(AGENTS)]
        assert {n.machine_id for n in nodes.values()} == {machine_id("sim", i) for i in range(AGENTS)}

        issued: dict[str, tuple[int, str]] = {}
        for node in nodes.values():
            for kind in ("node.health", "inventory.refresh"):
                response = requests.post(f"{live_console}/api/v1/nodes/{node.pk}/commands/", json={"type": kind},
                                         headers=api, timeout=30)
                assert response.status_code == 201, response.text
                issued[response.json()["id"]] = (node.pk, kind)
        wait_until(lambda: Command.objects.filter(pk__in=issued, state=CommandState.SUCCEEDED).count() == len(issued),
                   60, "every command answered")
        fleet.wait_for(lambda s: s["totals"]["telemetry_batches"] >= 3 * AGENTS, 60, "three telemetry batches per agent")
        fleet.stop_telemetry()
        agents = {a["hostname"]: a for a in fleet.agent_summaries()}
        receipts = fleet.receipts()
        snapshot = fleet.snapshot()

    assert snapshot["totals"]["errors"] == {}, snapshot["totals"]["errors"]
    # Every command was answered with a plausible result and received by its own node's agent.
    for command in Command.objects.filter(pk__in=issued):
        node_id, kind = issued[str(command.pk)]
        assert command.error == "" and command.result, (kind, command.error)
        if kind == "node.health":
            assert command.result["ok"] is True and len(command.result["gpus"]) == 2
        else:
            assert command.result["format"] == "lockstep.inventory/v1"
    for node in nodes.values():
        assert Gpu.objects.filter(node=node).count() == 2
        assert Nic.objects.filter(node=node).count() == 3  # two rails and the management NIC
        assert Node.objects.get(pk=node.pk).health_report["ok"] is True
    by_id = Counter(r["id"] for r in receipts)
    assert set(by_id) == set(issued)
    assert {r["id"]: r["node_id"] for r in receipts} == {cid: node_id for cid, (node_id, _) in issued.items()}
    deliveries = Command.objects.filter(pk__in=issued).aggregate(n=Sum("attempt"))["n"]
    assert sum(by_id.values()) == deliveries == sum(a["commands_received"] for a in agents.values())
    assert sum(a["results_accepted"] for a in agents.values()) == len(issued)

    # Telemetry: per agent, the console holds exactly the batches the agent had accepted,
    # seq 1..last without a gap or a duplicate, and every record.
    batches = {row["node__name"]: row for row in TelemetryBatch.objects.filter(cluster=cluster)
               .values("node__name").annotate(n=Count("id"), last=Max("seq"), records=Sum("record_count"))}
    records = dict(TelemetryRecord.objects.filter(cluster=cluster).values_list("node__name").annotate(n=Count("id")))
    for name, agent in agents.items():
        assert agent["telemetry_duplicates"] == 0
        seqs = sorted(TelemetryBatch.objects.filter(node=nodes[name]).values_list("seq", flat=True))
        assert seqs == list(range(1, agent["last_seq"] + 1))
        assert batches[name]["n"] == agent["telemetry_batches"] == agent["last_seq"]
        assert records[name] == batches[name]["records"] == agent["telemetry_records"] == 5 * agent["last_seq"]
        assert Node.objects.get(pk=nodes[name].pk).telemetry_seq == agent["last_seq"]
        assert agent["heartbeats"] >= 1 and agent["polls"] >= 1 and agent["inventories"] == 1


def test_a_restarted_fleet_reuses_its_credentials_and_continues_its_telemetry_seq(cluster, live_console, tmp_path):
    token = make_enrollment_token(cluster, max_uses=None)  # a fleet of more nodes than the default uses
    state = str(tmp_path / "fleet-state.json")
    config = _config(live_console, token, cluster, agents=3, state_file=state)
    for run in (1, 2):
        with BackgroundFleet(config) as fleet:
            fleet.wait_for(_running(3), 60, "3 agents running")
            fleet.wait_for(lambda s, run=run: s["totals"]["telemetry_batches"] >= 6, 30, "two batches per agent")
            fleet.stop_telemetry()
            agents = fleet.agent_summaries()
            assert sum(a["enroll_attempts"] for a in agents) == (3 if run == 1 else 0)
    assert Node.objects.filter(cluster=cluster).count() == 3
    for agent in agents:
        seqs = list(TelemetryBatch.objects.filter(node_id=agent["node_id"]).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, agent["last_seq"] + 1)) and agent["last_seq"] > agent["telemetry_batches"]


def test_agents_stop_when_refused_and_a_retired_node_stops_only_its_own_agent(world, cluster, live_console):
    with BackgroundFleet(_config(live_console, "lse_AAAAAAAAAAAA.not-a-secret", cluster, agents=3)) as fleet:
        snap = fleet.wait_for(lambda s: s["agents"]["failed"] == 3, 30, "every enrollment refused")
    assert snap["totals"]["errors"] == {"enroll:401": 3}
    assert not Node.objects.filter(cluster=cluster).exists()

    token = make_enrollment_token(cluster, max_uses=None)  # a fleet of more nodes than the default uses
    api = {"Authorization": f"Bearer {world.token('alice')}"}
    with BackgroundFleet(_config(live_console, token, cluster, agents=3, telemetry_every_s=None)) as fleet:
        fleet.wait_for(_running(3), 60, "3 agents running")
        victim = Node.objects.get(cluster=cluster, name=hostname("sim", 1))
        response = requests.post(f"{live_console}/api/v1/nodes/{victim.pk}/retire/", headers=api, timeout=30)
        assert response.status_code == 200, response.text
        snap = fleet.wait_for(lambda s: s["agents"]["stopped"] == 1, 30, "the retired node's agent to stop")
        assert snap["agents"]["running"] == 2
        stopped = [a for a in fleet.agent_summaries() if a["state"] == "stopped"]
    assert [a["hostname"] for a in stopped] == [victim.name]
    assert "401" in stopped[0]["reason"] or "403" in stopped[0]["reason"]
