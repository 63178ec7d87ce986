"""Path discovery as a state machine: what it sends, how answers become routes and link ids,
retries, switches that quote too little, lossy flows first, and what a re-plan keeps."""

from __future__ import annotations

from probemesh_testlib import checked

from agent.probemesh.paths import ATTEMPTS, PathDiscovery
from agent.probemesh.plan import engine_config

# node0000/nic0 -> leaf0 -> spine{0,1} -> leaf1 -> node0001/nic0, each switch answering from its ingress port
ROUTERS = {
    "172.16.0.0": ["leaf0", "L-nic0"],          # leaf0's port to node0000/nic0
    "100.64.0.1": ["spine0", "L-l0-s0"], "100.64.0.3": ["spine1", "L-l0-s1"],
    "100.64.0.5": ["leaf1", "L-s0-l1"], "100.64.0.7": ["leaf1", "L-s1-l1"],
    "172.16.1.1": ["node0001/nic0", "L-nic1"],  # the peer's own address: its access link
}
PATH_VIA = {0: ["172.16.0.0", "100.64.0.1", "100.64.0.5"], 1: ["172.16.0.0", "100.64.0.3", "100.64.0.7"]}


def discovery(**paths) -> tuple[PathDiscovery, object]:
    plan = checked({"nics": [{"name": "node0000/nic0", "address": "172.16.0.1",
                              "peers": [["node0001/nic0", "172.16.1.1"], ["node0002/nic0", "172.16.2.1"]]}],
                    "sport_count": 4, "routers": ROUTERS,
                    "paths": {"traces_per_s": 100, "timeout_ms": 200} | paths})
    cfg = engine_config(plan)
    pd = PathDiscovery({}, {})
    pd.configure(cfg)
    return pd, cfg


def answer(pd: PathDiscovery, probes, now: float, via=lambda sport: PATH_VIA[sport % 2], quote=True,
           silent=frozenset()):
    """Answer trace probes as the fabric would: switches by TTL, the peer when the TTL reaches it."""
    for token, peer_i, sport, ttl in probes:
        hops = via(sport)
        if (sport, ttl) in silent:
            continue
        if peer_i != 0:  # node0002 is not reachable in this fabric: its leaf says unreachable
            pd.on_hop({"token": token, "ttl": ttl, "from": "172.16.0.0", "kind": "unreach"}, now)
            continue
        if ttl <= len(hops):
            ev = {"token": token if quote else None, "ttl": ttl if quote else None, "from": hops[ttl - 1],
                  "kind": "ttl", "nic": 0, "sport": sport, "dst": "172.16.1.1"}
        else:
            ev = {"token": token, "ttl": ttl, "from": "172.16.1.1", "kind": "reached"}
        pd.on_hop(ev, now)


def run(pd, seconds: float, step: float = 0.05, start: float = 100.0, **kw) -> float:
    now = start
    while now < start + seconds:
        answer(pd, pd.due(now), now + step / 2, **kw)
        now += step
    return now


def test_every_flow_of_a_reachable_peer_gets_its_path_as_link_ids():
    pd, _ = discovery()
    run(pd, 2.0)
    for sport in range(4):
        route = pd.route("node0000/nic0", "node0001/nic0", "172.16.1.1", sport)
        assert route is not None, sport
        spine = "s0" if sport % 2 == 0 else "s1"
        assert route.links == ("L-nic0", f"L-l0-{spine}", f"L-{spine}-l1", "L-nic1")
        assert route.devices == ("leaf0", "spine0" if spine == "s0" else "spine1", "leaf1", "node0001/nic0")
    assert pd.single_route("node0000/nic0", "node0001/nic0", "172.16.1.1") is None  # two paths
    stats = pd.stats()
    assert stats["known"] == 4 and stats["mapped"] == 4 and stats["tracing"] == 0
    assert stats["failed"] == 4  # the unreachable peer's flows


def test_a_pair_on_one_path_has_a_single_route():
    pd, _ = discovery()
    run(pd, 2.0, via=lambda sport: PATH_VIA[0])
    single = pd.single_route("node0000/nic0", "node0001/nic0", "172.16.1.1")
    assert single is not None and single.links[1] == "L-l0-s0"


def test_after_its_first_trace_a_peer_is_traced_only_as_deep_as_it_is():
    pd, _ = discovery(max_ttl=8)
    first = pd.due(100.0)
    assert sorted({ttl for *_, ttl in first if _[1] == 0}) == list(range(1, 9))
    answer(pd, first, 100.01)
    later = pd.due(100.2)
    ttls = {ttl for _t, peer, _s, ttl in later if peer == 0}
    assert ttls and max(ttls) == 4  # 3 switches, the peer answers at 4


def test_a_silent_hop_is_retried_and_a_flow_that_never_completes_is_failed():
    pd, _ = discovery()
    run(pd, 3.0, silent={(s, 2) for s in range(4)})  # spines never answer
    assert pd.stats()["known"] == 0
    assert pd.stats()["failed"] == 8


def test_a_hop_silent_once_is_filled_by_the_retry():
    pd, _ = discovery()
    calls = {"n": 0}

    def flaky_via(sport):
        calls["n"] += 1
        return PATH_VIA[sport % 2]

    first = pd.due(100.0)
    answer(pd, first, 100.01, silent={(0, 3)})  # leaf1 misses one answer on flow 0
    assert pd.route("node0000/nic0", "node0001/nic0", "172.16.1.1", 0) is None
    run(pd, 1.0, start=100.3)
    route = pd.route("node0000/nic0", "node0001/nic0", "172.16.1.1", 0)
    assert route is not None and route.links[2] == "L-s0-l1"
    assert ATTEMPTS >= 2


def test_switches_that_quote_only_the_udp_header_turn_discovery_to_one_ttl_at_a_time():
    pd, _ = discovery()
    run(pd, 6.0, quote=False)
    assert pd.serial
    route = pd.route("node0000/nic0", "node0001/nic0", "172.16.1.1", 1)
    assert route is not None and route.links == ("L-nic0", "L-l0-s1", "L-s1-l1", "L-nic1")


def test_unmapped_addresses_give_hops_without_link_ids():
    pd, cfg = discovery()
    pd.routers = {k: v for k, v in pd.routers.items() if not k.startswith("100.64")}
    run(pd, 2.0)
    route = pd.route("node0000/nic0", "node0001/nic0", "172.16.1.1", 0)
    assert route.hops == ("172.16.0.0", "100.64.0.1", "100.64.0.5", "172.16.1.1")
    assert route.links is None and route.devices is None
    assert route.to_json() == {"hops": list(route.hops)}


def test_lossy_flows_are_traced_first_and_a_failed_retrace_keeps_the_known_path():
    pd, _ = discovery(refresh_s=3600)
    now = run(pd, 2.0)
    assert pd.stats()["tracing"] == 0
    assert pd.due(now) == []  # everything known or failed: nothing to refresh yet
    pd.mark_lossy("node0000/nic0", "node0001/nic0", "172.16.1.1", [2], now)
    probes = pd.due(now + 0.1)
    assert {(peer, sport) for _t, peer, sport, _ttl in probes} == {(0, 2)}
    before = pd.route("node0000/nic0", "node0001/nic0", "172.16.1.1", 2)
    run(pd, 1.0, start=now + 0.2, silent={(2, t) for t in range(1, 9)})  # the retrace gets nothing
    assert pd.route("node0000/nic0", "node0001/nic0", "172.16.1.1", 2) == before
    pd.mark_lossy("node0000/nic0", "node0001/nic0", "172.16.1.1", [2], now + 1.5)
    assert pd.due(now + 1.6) == []  # not again within URGENT_EVERY_S


def test_a_replan_keeps_the_routes_of_flows_that_remain():
    pd, cfg = discovery()
    run(pd, 2.0)
    plan = checked({"nics": [{"name": "node0000/nic0", "address": "172.16.0.1",
                              "peers": [["node0001/nic0", "172.16.1.1"], ["node0009/nic0", "172.16.9.1"]]}],
                    "sport_count": 4, "routers": ROUTERS})
    pd.configure(engine_config(plan))
    assert pd.stats()["known"] == 4 and pd.stats()["failed"] == 0  # node0002's flows are gone
    assert pd.index[("node0000/nic0", "node0009/nic0", "172.16.9.1")] == 1


def test_disabled_discovery_sends_nothing():
    pd, _ = discovery(enabled=False)
    assert pd.due(100.0) == []
