"""The console side of the probe.mesh plan: an operator starts the mesh through the API; the
console accepts the plans the agent accepts and refuses, naming the field, the plans the agent
would refuse; nothing is stored for a bad one."""

from __future__ import annotations

import copy

import pytest

from agent.commands import ArgError, validate_args
from agent.probemesh import plan as agentplan
from console.commands import registry
from console.commands import services as command_services
from console.commands.models import Command
from console.commands.probemesh import ports_for_paths
from console.core.errors import Invalid
from tests.factories import make_fleet

PLAN = {
    "nics": [{"name": "node0000/nic0", "interface": "nic0", "address": "172.16.0.1",
              "peers": [["node0001/nic0", "172.16.0.3"], ["node0002/nic0", "172.16.1.1"]]},
             {"name": "node0000/nic1", "interface": "nic1", "address": "172.16.2.1", "peers": []}],
    "interval_ms": 10, "window_ms": 1000,
    "paths": {"enabled": True, "traces_per_s": 20},
    "routers": {"172.16.0.0": ["leaf-su00-r0", "node0000/nic0~leaf-su00-r0"], "100.64.0.1": ["spine-0", None]},
}


def variant(path: str, value) -> dict:
    doc = copy.deepcopy(PLAN)
    target = doc
    keys = path.split(".")
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    if isinstance(target, list):
        target[int(keys[-1])] = value
    else:
        target[keys[-1]] = value
    return doc


GOOD = [PLAN, {}, PLAN | {"sport_count": 8, "engine": "python", "timestamps": "hardware", "tx_timestamps": False},
        PLAN | {"interval_ms": 1, "deadline_floor_ms": 2}, PLAN | {"ecmp_paths": 64, "coverage": 0.999},
        PLAN | {"paths": None, "routers": None, "sport_count": None, "deadline_max_ms": None}]

BAD = [
    (variant("nics.0.address", "172.16.0.300"), "nics[0].address"),
    (variant("nics.0.name", "node 0"), "nics[0].name"),
    (variant("nics.0.peers.1", ["node0002/nic0", "10.0.0"]), "nics[0].peers[1][1]"),
    (variant("nics.0.peers.1", ["node0001/nic0", "172.16.1.1"]), "nics[0].peers[1][0]"),
    (variant("nics.0.peers.1", ["node0000/nic0", "172.16.1.1"]), "nics[0].peers[1]"),
    (variant("nics.1.address", "172.16.0.1"), "nics[1].address"),
    (variant("nics.0", {"name": "n", "address": "1.2.3.4", "rail": 0}), "nics[0].rail"),
    (variant("nics.0", {"address": "1.2.3.4"}), "nics[0].name"),
    (variant("routers", {"1.2.3.4": "leaf"}), "routers['1.2.3.4']"),
    (variant("routers", {"leaf": ["leaf", None]}), "routers['leaf']"),
    (variant("paths", {"max_ttl": 0}), "paths.max_ttl"),
    (variant("paths", {"enabled": "yes"}), "paths.enabled"),
    (variant("paths", {"ttl": 3}), "paths.ttl"),
    (PLAN | {"interval_ms": 0.5}, "interval_ms"),
    (PLAN | {"window_ms": 10000, "interval_ms": 2}, "window_ms"),
    (PLAN | {"interval_ms": 200, "window_ms": 100}, "window_ms"),
    (PLAN | {"sport_first": 65000, "sport_count": 1000}, "sport_count"),
    (PLAN | {"port": 40010}, "port"),
    (PLAN | {"ecmp_paths": 128}, "ecmp_paths"),
    (PLAN | {"deadline_max_ms": 900}, "deadline_max_ms"),
    (PLAN | {"deadline_max_ms": 2, "deadline_floor_ms": 5}, "deadline_max_ms"),
    (PLAN | {"timestamps": "ptp"}, "timestamps"),
    (PLAN | {"tx_timestamps": "yes"}, "tx_timestamps"),
    (PLAN | {"peers": []}, "peers"),
    (PLAN | {"nics": [{"name": f"me/nic{k}", "address": f"10.9.0.{k + 1}",
                       "peers": [[f"n{i}/nic0", f"10.1.{i // 250}.{i % 250 + 1}"] for i in range(500)]}
                      for k in range(5)]}, "interval_ms"),
]


def agent_check(plan: dict) -> dict:
    return agentplan.check(validate_args(agentplan.ARGS, plan))


def console_check(plan: dict) -> dict:
    return registry.get("activity.set").validate_args({"name": "probe.mesh", "args": plan})["args"]


@pytest.mark.parametrize("plan", GOOD)
def test_what_the_console_accepts_the_agent_accepts_unchanged(plan):
    forwarded = console_check(plan)
    assert agent_check(forwarded) == agent_check(plan)


@pytest.mark.parametrize(("plan", "field"), BAD, ids=[f for _, f in BAD])
def test_a_plan_the_agent_refuses_the_console_refuses_naming_the_same_field(plan, field):
    with pytest.raises(ArgError) as agent_err:
        agent_check(plan)
    assert field in str(agent_err.value)
    with pytest.raises(Invalid) as console_err:
        console_check(plan)
    assert field in str(console_err.value.fields["args.args"]), console_err.value.fields


@pytest.mark.parametrize("paths", [1, 2, 8, 16, 64])
def test_both_sides_size_the_source_ports_alike(paths):
    assert ports_for_paths(paths, 0.99) == agentplan.ports_for_paths(paths, 0.99)


@pytest.fixture
def fleet(world):
    return make_fleet(world.acme)


@pytest.mark.django_db
def test_an_operator_starts_the_mesh_and_a_bad_plan_stores_nothing(world, fleet):
    client = world.client("carol")
    url = f"/api/v1/nodes/{fleet.node.pk}/commands/"
    ok = client.post(url, {"type": "activity.set", "args": {"name": "probe.mesh", "args": PLAN}}, format="json")
    assert ok.status_code == 201, ok.json()
    stored = Command.objects.get(pk=ok.json()["id"]).args
    assert stored["args"]["nics"] == PLAN["nics"] and stored["args"]["paths"]["traces_per_s"] == 20.0
    count = Command.objects.count()
    bad = client.post(url, {"type": "activity.set", "args": {"name": "probe.mesh", "args": BAD[0][0]}},
                      format="json")
    assert bad.status_code == 400
    assert "nics[0].address: '172.16.0.300' is not an IPv4 address" in str(bad.json()["fields"]["args.args"])
    assert Command.objects.count() == count


@pytest.mark.django_db
def test_a_large_fabrics_plan_fits_the_probe_mesh_bound_and_a_huge_one_does_not(fleet):
    peers = [[f"node{i:04d}/nic0", f"172.16.{i // 100}.{i % 100 + 1}"] for i in range(64)]
    nics = [{"name": f"node9999/nic{k}", "interface": f"nic{k}", "address": f"172.20.{k}.1", "peers": peers}
            for k in range(8)]
    routers = {f"100.64.{i // 250}.{i % 250}": [f"spine-{i % 16}", f"L{i}"] for i in range(2000)}
    command, _ = command_services.issue_command(fleet.node, "activity.set",
                                        {"name": "probe.mesh", "args": {"nics": nics, "routers": routers}})
    assert len(command.args["args"]["nics"]) == 8  # ~100 KB: above other activities' 16 KiB bound
    routers = {f"100.{64 + i // 60000}.{i // 250 % 240}.{i % 250}": [f"spine-{i % 16}", f"link-{i:06d}"]
               for i in range(20000)}
    with pytest.raises(Invalid) as err:
        command_services.issue_command(fleet.node, "activity.set", {"name": "probe.mesh", "args": {"routers": routers}})
    assert "the plan is larger than 524288 bytes" in str(err.value.fields["args.args"])
