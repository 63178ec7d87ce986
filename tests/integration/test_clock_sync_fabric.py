"""Clock sync end to end: real agents in network namespaces, each with its own virtual clock
(the agent's test-only LOCKSTEP_TEST_CLOCK_* variables: namespaces share one kernel clock, so
the truth is known), the console served by `manage.py serve` (on embedded defaults it runs the
periodic tasks and the solve in-process; with PostgreSQL and Redis a Celery worker solves).

The console starts clock.sync through the API; every node turns synced with its offset within
5 µs of the truth and the bound the console states; each agent's local socket serves cluster
time. Then one host's clock steps by 3 ms (its agent restarts with the new virtual offset, as
a stepped clock looks to the rest of the cluster): the console detects the step, counts it, and
the node's correction follows it.
"""

from __future__ import annotations

import os
import random
import sys
import time

import pytest
import requests

from agent.clocksync.clock import ClockSource
from agent.localsock.client import AgentSocket
from console.clocks.models import ClockSync, NodeClock
from console.core import scoping
from console.fleet import services as fleet_services
from console.tenancy import services as tenancy
from console.tenancy.models import TokenScope
from testbed import Fabric, generate, netns_problem
from testbed.testing import unique_prefix
from tests.integration.conftest import Process, free_port, process_env, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.slow]

# Software kernel timestamps through veth pairs and switch namespaces on a shared 2-core machine
# (the prober test's bound): scheduling delays enter as queueing, which the estimator removes.
OFFSET_BOUND_NS = 5_000
# What a node serves between corrections (sent every CLOCK_CORRECT_EVERY_S, extrapolated with drift).
SERVED_BOUND_NS = 50_000
STEP_NS = 3_000_000


def real_instant(source: ClockSource, local_ns: int) -> int:
    real = local_ns - source.offset_ns
    for _ in range(3):
        real = local_ns - (source.transform(real) - real)
    return real


def clock_env(source: ClockSource) -> dict[str, str]:
    return {"LOCKSTEP_TEST_CLOCK_OFFSET_NS": str(source.offset_ns),
            "LOCKSTEP_TEST_CLOCK_DRIFT_PPM": repr(source.drift_ppm),
            "LOCKSTEP_TEST_CLOCK_EPOCH_NS": str(source.epoch_ns), "LOCKSTEP_LOG_LEVEL": "info"}


@pytest.fixture
def worker_when_brokered(request):
    """With Redis, the solve is a Celery task: a real worker runs it."""
    if os.environ.get("REDIS_URL"):
        return request.getfixturevalue("celery_worker_process")
    return None


def test_agents_in_namespaces_sync_to_the_reference_and_a_stepped_clock_is_detected_and_corrected(
        transactional_db, tmp_path, worker_when_brokered):
    if netns_problem() is not None:
        pytest.skip(f"needs root and network namespaces: {netns_problem()}")
    topology = generate(hosts=4, rails=1, hosts_per_leaf=2, spines=1, name="clock-fabric")
    with scoping.unscoped("the test arranges an organization"):
        from django.contrib.auth import get_user_model

        owner = get_user_model().objects.create_user("clock-owner", password="pw-clock-owner")
        org = tenancy.create_organization("Clock Org", owner, slug="clock-org")
    with scoping.for_organization(org.pk):
        cluster = fleet_services.create_cluster(org.pk, "clock-cluster", "")
        fleet_services.import_topology(cluster, topology)
        enroll_token = fleet_services.mint_enrollment_token(cluster, description="agents", max_uses=None).plaintext
        api_token = tenancy.mint_api_token(org.pk, owner, name="clock", scope=TokenScope.WRITE).plaintext
    fab = Fabric.up(topology, prefix=unique_prefix(), base_dir=tmp_path / "testbed")
    server = None
    try:
        port = free_port()
        server = Process([sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port),
                          "--also-listen", fab.bridge_address],
                         process_env(LOCKSTEP_CLOCK_CORRECT_EVERY_S="5", LOCKSTEP_HTTPS="0"), tmp_path / "serve.log")
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: requests.get(f"{base}/healthz", timeout=1).ok, 60, "the console")
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {api_token}"

        rng = random.Random(11)
        epoch = time.time_ns()
        clocks = {h: ClockSource(int(rng.uniform(-50e6, 50e6)), rng.uniform(-50, 50), epoch) for h in fab.hosts}
        for host in fab.hosts:
            fab.start_agents(console_url=fab.console_url(port), token=enroll_token, cluster_id=cluster.pk,
                             hosts=[host], env=clock_env(clocks[host]))

        def nodes():
            return {n["name"]: n for n in api.get(f"{base}/api/v1/nodes/", params={"cluster": cluster.pk},
                                                  timeout=10).json()["results"]}

        def addressed():
            nics = api.get(f"{base}/api/v1/nics/", params={"cluster": cluster.pk, "limit": 100}, timeout=10).json()
            return {n["name"] for n in nics["results"] if n.get("addresses")}

        wait_until(lambda: sorted(h for h, n in nodes().items() if n["state"] == "ready") == fab.hosts
                   and {f"{h}/nic0" for h in fab.hosts} <= addressed(), 120, "every agent ready with its inventory")

        started = api.post(f"{base}/api/v1/clock-syncs/", json={"cluster": cluster.pk, "window_s": 2.0}, timeout=30)
        assert started.status_code == 201, started.text
        sync_id = started.json()["id"]
        assert started.json()["planned"] == fab.hosts and started.json()["reference_name"] == fab.hosts[0]
        ref = fab.hosts[0]

        def node_clocks():
            rows = api.get(f"{base}/api/v1/node-clocks/", params={"cluster": cluster.pk}, timeout=10).json()["results"]
            return {r["node_name"]: r for r in rows}

        def synced_rows(expect_step: str | None = None):
            with scoping.for_organization(org.pk):
                rows = {c.node.name: c for c in NodeClock.objects.filter(cluster_id=cluster.pk).select_related("node")}
            if sorted(rows) != fab.hosts or any(c.state not in ("synced", "reference") for c in rows.values()):
                return None
            if expect_step and rows[expect_step].steps < 1:
                return None
            out = {}
            for host, c in rows.items():
                at_ref = c.t_local_ns - round(c.offset_ns)  # the solve's instant on the reference clock
                real = real_instant(clocks[ref], at_ref)
                truth = clocks[host].transform(real) - clocks[ref].transform(real)
                out[host] = (c.offset_ns - truth, c.bound_ns)
            return out if all(abs(err) < OFFSET_BOUND_NS for err, _ in out.values()) else None

        errs = wait_until(synced_rows, 120, "every node synced within 5 µs of the truth", interval=1.0)
        shown = node_clocks()
        assert {h: r["state"] for h, r in shown.items()} == {ref: "reference", **{h: "synced" for h in fab.hosts[1:]}}
        for host, (err, bound) in errs.items():
            assert bound == pytest.approx(shown[host]["bound_ns"]) and bound < OFFSET_BOUND_NS, (host, err, bound)
        quality = api.get(f"{base}/api/v1/clock-syncs/{sync_id}/", timeout=10).json()
        assert quality["nodes_synced"] == 4 and quality["disconnected"] == [] and quality["worst_bound_ns"] < 5000

        def served(host):
            """The agent's local socket: synced, and its offset the truth now (within what it serves)."""
            answer = AgentSocket(str(fab.agents()[host]["state_dir"]) + "/agent.sock").time(timeout=2)
            if not answer or not answer["synced"]:
                return False
            # offset_ns is cluster time − this node's clock (docs/agent-protocol.md, "time")
            real = real_instant(clocks[host], int(answer["cluster_time_ns"]) - round(answer["offset_ns"]))
            truth = clocks[ref].transform(real) - clocks[host].transform(real)
            return abs(answer["offset_ns"] - truth) < SERVED_BOUND_NS

        for host in fab.hosts:
            wait_until(lambda h=host: served(h), 60, f"{host}'s local socket serving cluster time", interval=0.5)

        # node0002's clock steps by 3 ms: its agent restarts reading the stepped clock
        stepped = fab.hosts[2]
        fab.stop_agents([stepped])
        old = clocks[stepped]
        clocks[stepped] = ClockSource(old.offset_ns + STEP_NS, old.drift_ppm, old.epoch_ns)
        fab.start_agents(console_url=fab.console_url(port), token=enroll_token, cluster_id=cluster.pk,
                         hosts=[stepped], env=clock_env(clocks[stepped]))
        wait_until(lambda: synced_rows(expect_step=stepped), 120, "the step detected and the node re-synced",
                   interval=1.0)
        step = node_clocks()[stepped]
        assert step["steps"] >= 1 and step["last_step_ns"] == pytest.approx(STEP_NS, abs=OFFSET_BOUND_NS)
        assert all(node_clocks()[h]["steps"] == 0 for h in fab.hosts if h != stepped)
        wait_until(lambda: served(stepped), 60, "the stepped node serving corrected cluster time", interval=0.5)
        with scoping.for_organization(org.pk):
            assert ClockSync.objects.get(cluster_id=cluster.pk).nodes_synced == 4
    finally:
        fab.stop_agents()
        fab.down()
        if server is not None:
            server.stop()
            if os.environ.get("LOCKSTEP_TEST_SHOW_LOGS"):
                sys.stderr.write(server.output())
