"""The probe.mesh plan: defaults, the source-port formula, derived values, and every refusal named."""

from __future__ import annotations

import copy
import random

import pytest

from agent.commands.registry import ArgError, validate_args
from agent.probemesh import plan as planmod
from agent.probemesh.native import config_lines


def checked(doc: dict) -> dict:
    return planmod.check(validate_args(planmod.ARGS, doc))


GOOD = {
    "nics": [
        {"name": "node0000/nic0", "interface": "nic0", "address": "172.16.0.1",
         "peers": [["node0001/nic0", "172.16.0.3"], ["node0002/nic0", "172.16.1.1"]]},
        {"name": "node0000/nic1", "interface": "nic1", "address": "172.16.2.1", "peers": []},
    ],
    "routers": {"172.16.0.0": ["leaf-su00-r0", "node0000/nic0~leaf-su00-r0"], "100.64.0.1": ["spine-0", None]},
}


def test_defaults_are_a_valid_plan_that_probes_nothing():
    plan = checked({})
    assert plan["nics"] == [] and plan["interval_ms"] == 10.0 and plan["window_ms"] == 1000
    assert plan["sport_count"] == 115  # 16 paths at coverage 0.99
    assert plan["deadline_max_ms"] == 200.0
    assert plan["paths"] == planmod.PATHS_DEFAULTS


def test_a_good_plan_becomes_the_engine_configuration():
    cfg = planmod.engine_config(checked(GOOD))
    assert [n.name for n in cfg.nics] == ["node0000/nic0", "node0000/nic1"]
    assert cfg.peers == ((0, "node0001/nic0", "172.16.0.3"), (0, "node0002/nic0", "172.16.1.1"))
    assert cfg.interval_ns == 10_000_000 and cfg.window_ns == 1_000_000_000
    assert cfg.deadline_floor_ns == 5_000_000 and cfg.deadline_k_milli == 4000
    assert cfg.grace_ns == 40_000_000 and cfg.routers["100.64.0.1"] == ("spine-0", None)
    lines = config_lines(cfg)
    assert lines[0] == "reset" and lines[-1] == "commit"
    assert "nic 0 node0000/nic0 nic0 172.16.0.1 40000 115" in lines
    assert "nic 1 node0000/nic1 nic1 172.16.2.1 40000 115" in lines
    assert "peer 1 0 node0002/nic0 172.16.1.1" in lines
    assert cfg.rate == 200.0


@pytest.mark.parametrize(("paths", "coverage", "ports"), [
    (1, 0.99, 1), (2, 0.99, 8), (4, 0.99, 21), (8, 0.99, 51), (16, 0.99, 115), (32, 0.99, 255),
    (64, 0.99, 557), (16, 0.999, 150),
])
def test_source_ports_are_the_fewest_that_reach_every_path_at_the_coverage(paths, coverage, ports):
    assert planmod.ports_for_paths(paths, coverage) == ports
    assert planmod._p_all(ports, paths) >= coverage > planmod._p_all(ports - 1, paths)


def test_the_port_formula_agrees_with_hashing_at_random():
    rng = random.Random(7)
    m, n, trials = 16, planmod.ports_for_paths(16, 0.99), 4000
    covered = sum(len({rng.randrange(m) for _ in range(n)}) == m for _ in range(trials))
    assert abs(covered / trials - planmod._p_all(n, m)) < 0.01


def test_the_deadline_cap_follows_the_interval():
    plan = checked({"interval_ms": 1.0})
    assert plan["deadline_max_ms"] == 40.0  # 60 intervals less a 20 ms grace
    assert checked({"interval_ms": 1.0, "deadline_floor_ms": 2})["deadline_max_ms"] == 40.0


def with_(path: str, value):
    doc = copy.deepcopy(GOOD)
    target = doc
    keys = path.split(".")
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


BAD = [
    (with_("nics.0.name", "node 0"), "nics[0].name: 'node 0' is not a name"),
    (with_("nics.0.name", 'x"y'), "nics[0].name"),
    (with_("nics.0.address", "172.16.0.300"), "nics[0].address: '172.16.0.300' is not an IPv4 address"),
    (with_("nics.0.address", "224.0.0.1"), "nics[0].address: 224.0.0.1 cannot be probed"),
    (with_("nics.0.interface", "a-very-long-interface-name"), "nics[0].interface"),
    (with_("nics.0.peers", "node0001/nic0"), "nics[0].peers: must be a list"),
    (with_("nics.0.peers.0", ["node0001/nic0"]), "nics[0].peers[0]: must be [name, address]"),
    (with_("nics.0.peers.1", ["node0002/nic0", "10.0.0"]), "nics[0].peers[1][1]: '10.0.0' is not an IPv4 address"),
    (with_("nics.0.peers.1", ["node0001/nic0", "172.16.1.1"]), "nics[0].peers[1][0]: 'node0001/nic0' is listed twice"),
    (with_("nics.0.peers.1", ["node0000/nic0", "172.16.1.1"]), "nics[0].peers[1]: a NIC does not probe itself"),
    (with_("nics.1.name", "node0000/nic0"), "nics[1].name: 'node0000/nic0' is listed twice"),
    (with_("nics.1.address", "172.16.0.1"), "nics[1].address: 172.16.0.1 is listed twice"),
    (with_("nics.0", {"name": "n", "address": "1.2.3.4", "rail": 0}), "nics[0].rail: unknown key"),
    (with_("nics.0", {"address": "1.2.3.4"}), "nics[0].name: required"),
    (with_("nics.0", "node0000/nic0"), "nics[0]: must be an object"),
    (with_("routers", {"1.2.3.4": "leaf"}), "routers['1.2.3.4']: must be [device, link id or null]"),
    (with_("routers", {"leaf": ["leaf", None]}), "routers['leaf']: 'leaf' is not an IPv4 address"),
    (with_("routers", {"1.2.3.4": ["leaf 1", None]}), "routers['1.2.3.4'][0]"),
    (with_("paths", {"max_ttl": 0}), "paths.max_ttl: must be an integer between 1 and 32, not 0"),
    (with_("paths", {"enabled": "yes"}), "paths.enabled: must be true or false"),
    (with_("paths", {"ttl": 3}), "paths.ttl: unknown key"),
    (GOOD | {"interval_ms": 0.5}, "argument 'interval_ms' must be at least 1"),
    (GOOD | {"window_ms": 50}, "argument 'window_ms' must be at least 100"),
    (GOOD | {"window_ms": 10000, "interval_ms": 2}, "window_ms: 5,000 probes per peer per window; at most 2000"),
    (GOOD | {"interval_ms": 200, "window_ms": 100}, "window_ms: 100 is shorter than interval_ms 200"),
    (GOOD | {"sport_count": 2000}, "argument 'sport_count' must be at most 1024"),
    (GOOD | {"sport_first": 65000, "sport_count": 1000}, "sport_count: ports 65000..65999 go past 65535"),
    (GOOD | {"port": 40010}, "port: 40010 is inside the source ports 40000..40114"),
    (GOOD | {"ecmp_paths": 128}, "ecmp_paths: 128 paths at coverage 0.99 need"),
    (GOOD | {"deadline_max_ms": 900}, "deadline_max_ms: 900; at interval_ms 10 a probe can wait at most 560 ms"),
    (GOOD | {"deadline_max_ms": 2, "deadline_floor_ms": 5}, "deadline_max_ms: 2 is below deadline_floor_ms 5"),
    (GOOD | {"timestamps": "ptp"}, "argument 'timestamps' must be one of"),
    (GOOD | {"engine": "rust"}, "argument 'engine' must be one of"),
    (GOOD | {"peers": []}, "unknown argument 'peers'"),
    (GOOD | {"dscp": 64}, "argument 'dscp' must be at most 63"),
]


@pytest.mark.parametrize(("doc", "message"), BAD, ids=[m[:40] for _, m in BAD])
def test_a_bad_plan_is_refused_with_the_field_named(doc, message):
    with pytest.raises(ArgError) as err:
        checked(doc)
    assert message in str(err.value)


def test_bounds_on_peers_and_rate_are_named():
    many = [[f"n{i}/nic0", f"10.1.{i // 250}.{i % 250 + 1}"] for i in range(513)]
    with pytest.raises(ArgError, match=r"nics\[0\].peers: 513 peers; at most 512 per NIC"):
        checked({"nics": [{"name": "me/nic0", "address": "10.9.0.1", "peers": many}]})
    nics = [{"name": f"me/nic{k}", "address": f"10.9.0.{k + 1}", "peers": many[:500]} for k in range(5)]
    with pytest.raises(ArgError, match=r"interval_ms: 2500 peers every 10 ms is 250,000 probes/s; at most 200,000"):
        checked({"nics": nics})
    assert checked({"nics": nics, "interval_ms": 20})["sport_count"] == 115
    with pytest.raises(ArgError, match=r"argument 'nics' is longer than 16"):
        checked({"nics": [{"name": f"me/nic{k}", "address": f"10.9.0.{k + 1}"} for k in range(17)]})
