"""The console side of the audit's agent commands: every type the agent ships is registered, the
console accepts what the agent accepts and refuses, naming the field, what it would refuse."""

from __future__ import annotations

import pytest

from agent.audit.commands import checked_node_args
from agent.commands import ArgError, default_registry, load_modules, validate_args
from console.commands import registry
from console.commands import services as command_services
from console.commands.models import Command
from console.core.errors import Invalid
from tests.factories import make_fleet

AUDIT_TYPES = ["audit.affinity", "audit.collective", "audit.gpu", "audit.host", "audit.load", "audit.nic",
               "audit.node", "audit.pcie"]

FLOW = {"id": 0, "src": "node0000/nic0", "src_addr": "172.16.0.1", "device": "nic0", "dst": "node0002/nic0",
        "dst_addr": "172.16.1.1", "sport": 40000, "dport": 47000, "rate_mbit": 10.0}
LISTEN = {"nic": "node0000/nic0", "addr": "172.16.0.1", "device": "nic0", "port": 47000,
          "flows": [{"id": 3, "src": "node0002/nic0"}]}

GOOD = {
    "audit.node": {"sections": ["gpu", "nic"], "hardware": "h100-sxm", "mtu": 4200,
                   "nics": [{"device": "enp25s0np0", "rail": 0, "mtu": 4200, "speed_mbps": 400000}],
                   "rails": [{"rail": 0, "nic": "enp25s0np0"}],
                   "expect": {"kernel": "5.15.0", "nccl": ["2.21.5"]}},
    "audit.gpu": {"expected_gpus": 8, "listen_ms": 500},
    "audit.pcie": {"nics": [{"device": "ibp24s0"}]},
    "audit.affinity": {"rails": [{"rail": 1, "nic": "ibp64s0", "gpu": 1}]},
    "audit.nic": {"speed_mbps": 400000, "mtu": 4092},
    "audit.host": {"expect": {"gpu_driver": "565.57.01", "hugepages_total": 0}},
    "audit.load": {"run": 7, "start_at": 1796400000.5, "duration_s": 10.0, "window_s": 1.0, "flows": [FLOW],
                   "listen": [LISTEN]},
    "audit.collective": {"init": "tcp://172.16.0.1:29500", "world_size": 2, "rank_offset": 1, "ifname": "nic0",
                         "env": {"NCCL_IB_HCA": "mlx5_0"}, "sizes": [1048576], "threshold": "per_nic_busbw_gbs",
                         "hardware": "h100-sxm"},
}

BAD = [
    ("audit.node", {"sections": ["gpu", "disks"]}, "sections"),
    ("audit.node", {"nics": [{"device": "x", "mtu": 10}]}, "nics"),
    ("audit.node", {"color": "red"}, "color"),
    ("audit.node", {"expect": {"kernal": "6.1"}}, "expect"),
    ("audit.gpu", {"listen_ms": -1}, "listen_ms"),
    ("audit.affinity", {"rails": [{"nic": "x"}]}, "rails"),
    ("audit.load", {"run": 1, "start_at": 1.0, "duration_s": 1000.0}, "duration_s"),
    ("audit.load", {"run": 1, "start_at": 1.0, "duration_s": 5.0, "flows": [FLOW, FLOW]}, "flows"),
    ("audit.load", {"run": 1, "start_at": 1.0, "duration_s": 5.0, "flows": [FLOW | {"src_addr": "nope"}]}, "flows"),
    ("audit.load", {"run": 1, "start_at": 1.0, "duration_s": 5.0, "flows": [FLOW | {"rate_mbit": 0.0}]},
     "flows[0].rate_mbit"),
    ("audit.collective", {"init": "file:///tmp/x", "world_size": 2}, "init"),
    ("audit.collective", {"init": "tcp://a:1", "world_size": 2, "env": {"LD_PRELOAD": "x"}}, "env"),
    ("audit.collective", {"init": "tcp://a:1", "world_size": 2, "rank_offset": 2}, "rank_offset"),
]


def test_every_agent_audit_command_has_a_console_type():
    load_modules()
    assert sorted(n for n in default_registry.names() if n.startswith("audit.")) == AUDIT_TYPES
    assert [n for n in registry.names() if n.startswith("audit.")] == AUDIT_TYPES
    for name in AUDIT_TYPES:
        assert registry.get(name).timeout_s <= default_registry.get(name).timeout_s


@pytest.mark.parametrize("name", AUDIT_TYPES)
def test_what_the_console_accepts_the_agent_accepts(name):
    load_modules()
    validated = registry.get(name).validate_args(GOOD[name])
    agent_args = validate_args(default_registry.get(name).args, validated)
    if name in ("audit.node", "audit.nic", "audit.pcie", "audit.affinity", "audit.gpu", "audit.host"):
        checked_node_args(list(agent_args.get("sections") or ["gpu"]), agent_args)
    for key, value in GOOD[name].items():
        assert validated[key] == value, key


@pytest.mark.parametrize("name,args,field", BAD)
def test_bad_audit_arguments_are_refused_naming_the_field(name, args, field):
    with pytest.raises(Invalid) as info:
        registry.get(name).validate_args(args)
    assert any(key.startswith("args." + field.split("[")[0]) for key in info.value.fields), info.value.fields


@pytest.mark.parametrize("name,args,field", [b for b in BAD if b[0] == "audit.node"])
def test_the_agent_refuses_them_too(name, args, field):
    load_modules()
    with pytest.raises(ArgError):
        checked_node_args(args.get("sections", ["gpu"]),
                          validate_args(default_registry.get(name).args, args))


@pytest.mark.django_db
def test_an_operator_queues_an_audit_through_the_api_and_bad_input_stores_nothing(world):
    fleet = make_fleet(world.acme)
    client = world.client("carol")
    response = client.post("/api/v1/commands/", {"node": fleet.node.pk, "type": "audit.node",
                                                 "args": GOOD["audit.node"]}, format="json")
    assert response.status_code == 201, response.json()
    command = Command.objects.get(pk=response.json()["id"])
    assert command.args == GOOD["audit.node"] and command.timeout_s == 120
    count = Command.objects.count()
    bad = client.post("/api/v1/commands/", {"node": fleet.node.pk, "type": "audit.load",
                                            "args": {"run": 1, "start_at": 1.0, "duration_s": 5.0,
                                                     "flows": [FLOW | {"sport": 80}]}}, format="json")
    assert bad.status_code == 400 and "flows" in str(bad.json()["fields"])
    assert Command.objects.count() == count
    queued, created = command_services.issue_command(fleet.node, "audit.gpu", {"expected_gpus": 8})
    assert created and queued.args == {"expected_gpus": 8}
