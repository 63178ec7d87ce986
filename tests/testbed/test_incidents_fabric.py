"""Incidents end to end on the emulated fabric (4 hosts x 2 rails, 2 spines, real ECMP): the real
console under uvicorn (and a Celery worker where Redis is configured), a real agent in every host
namespace, the probe plan pushed through the REST API, the agents probing each other with the
native helper, their windows posted at once, triangulated by the console:

- a healthy fabric gives windows whose verdict is `network_ok` and no incident;
- random loss on one host cable opens one incident naming what the testbed's ground truth names
  (the cable's NIC: an access cable is named as its NIC), and healing it resolves the incident;
- a frozen host opens one naming the host, with `network_ok: true`; thawing it resolves it;
- a flapping cable is one incident, open across the flaps, resolved once the flapping stops.

Timing is not asserted (this machine is shared): the conditions are waited for.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests

from console.fleet.models import Cluster, Nic, Node, NodeState
from console.fleet.services import import_topology
from console.incidents.models import ProbeWindow, WindowState
from tests.conftest import REDIS, World
from tests.factories import make_enrollment_token
from tests.integration.conftest import ROOT, Process, free_port, process_env, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.slow]

# Generous deadlines and a short window: the machine is shared, a helper may wait for a CPU.
PLAN_OPTIONS = {"window_ms": 1000, "sport_count": 8, "deadline_floor_ms": 300, "paths": {"enabled": False}}
AGENT_ENV = {"LOCKSTEP_INVENTORY_INTERVAL_S": "5", "LOCKSTEP_HEALTH_INTERVAL_S": "30",
             "LOCKSTEP_AGENT_HEARTBEAT_INTERVAL_S": "5"}


@pytest.fixture(scope="module", autouse=True)
def helper_built():
    subprocess.run(["make", "-s", "native"], cwd=ROOT, check=True, capture_output=True)


@pytest.fixture
def stack(small_fabric, transactional_db, django_user_model, tmp_path):
    """The console (on the management network, where the namespaces reach it), a worker, agents."""
    fab = small_fabric
    world = World(django_user_model)
    cluster = Cluster.objects.create(organization=world.acme, name="fabric")
    import_topology(cluster, fab.topology.to_document())
    token = make_enrollment_token(cluster, max_uses=100)
    port = free_port()
    env = process_env(LOCKSTEP_AGENT_POLL_RECHECK_S="1")
    console = Process([sys.executable, "-m", "uvicorn", "console.asgi:application", "--host", fab.bridge_address,
                       "--port", str(port), "--lifespan", "off"], env, tmp_path / "uvicorn.log")
    worker = None
    try:
        base = fab.console_url(port)
        wait_until(lambda: requests.get(f"{base}/healthz", timeout=1).ok, 30, "the console to start")
        if REDIS:
            worker = Process([sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "solo",
                              "--without-heartbeat", "--without-gossip", "--without-mingle", "--loglevel", "INFO"],
                             env, tmp_path / "celery.log")
            wait_until(lambda: "ready" in worker.output(), 60, "the Celery worker to start")
        fab.start_agents(console_url=fab.console_url(port), token=token, cluster_id=cluster.pk, env=AGENT_ENV)
        yield fab, world, cluster, base
    finally:
        fab.stop_agents()
        fab.heal_all()
        for proc in (worker, console):
            if proc is not None:
                proc.stop()
        if "-s" in sys.argv:
            sys.stderr.write(console.output()[-5000:])


def api(world, base):
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {world.token('carol')}"
    return lambda method, path, **kw: session.request(method, f"{base}/api/v1/{path}", timeout=10, **kw)


def ready_with_addresses(cluster, fab) -> bool:
    ready = Node.objects.filter(cluster=cluster, state=NodeState.READY, in_topology=True).count()
    addressed = sum(1 for n in Nic.objects.filter(cluster=cluster, in_topology=True) if n.addresses)
    return ready == len(fab.hosts) and addressed == len(fab.nics)


def done_windows(cluster, since_ns: int):
    return list(ProbeWindow.objects.filter(cluster=cluster, start_ns__gte=since_ns,
                                           state=WindowState.DONE).order_by("start_ns"))


def open_incidents(call, cluster):
    return call("GET", "incidents/", params={"cluster": cluster.pk, "state": ["open", "acknowledged"]}).json()["results"]


def test_a_lossy_cable_and_a_frozen_host_open_incidents_naming_them_and_healing_resolves_them(stack):
    fab, world, cluster, base = stack
    call = api(world, base)
    wait_until(lambda: ready_with_addresses(cluster, fab), 90, "every agent ready with its NIC addresses")
    response = call("POST", "probe-plans/", json={"cluster": cluster.pk, "options": PLAN_OPTIONS})
    assert response.status_code == 201, response.text
    assert response.json()["nics"] == len(fab.nics) and response.json()["nodes"] == len(fab.hosts)

    # healthy: complete windows, network ok, nothing opened
    t0 = time.time_ns()
    wait_until(lambda: len([w for w in done_windows(cluster, t0) if w.reported == w.expected]) >= 3, 90,
               "three complete healthy windows triangulated")
    assert all(w.network_ok for w in done_windows(cluster, t0)), [w.verdict for w in done_windows(cluster, t0)]
    assert open_incidents(call, cluster) == []

    # 20 % random loss on one host cable, both ways
    cables = [lid for lid in fab.links if fab.link(lid).a.device in fab.nics or fab.link(lid).b.device in fab.nics]
    cable = cables[0]
    fault = fab.fault_link_loss(cable, "both", rate=0.2)
    truth = fab.ground_truth()["culprits"]
    assert len(truth) == 1
    named = wait_until(lambda: open_incidents(call, cluster), 60, f"an incident for the loss on {cable}")
    assert [(i["kind"], i["culprit"]) for i in named] == [(truth[0]["kind"], truth[0]["name"])], (named, truth)
    assert not named[0]["network_ok"]
    detail = call("GET", f"incidents/{named[0]['id']}/").json()
    assert detail["evidence"]["during"] and max(p["loss"] for p in detail["evidence"]["during"]) > 0.05
    status = call("GET", f"clusters/{cluster.pk}/status/").json()
    health = {e["name"]: e["health"] for e in status["nics"] + status["links"]}
    assert health[truth[0]["name"]] in ("degraded", "down")
    fab.heal(fault)
    wait_until(lambda: call("GET", f"incidents/{named[0]['id']}/").json()["state"] == "resolved", 60,
               "the incident to resolve once the cable is healed")
    assert len(call("GET", "incidents/", params={"cluster": cluster.pk}).json()["results"]) == 1

    # a frozen host: its NICs answer nothing; named as the host, the network is not to blame
    host = fab.hosts[-1]
    stall = fab.fault_host_stall(host)
    named = wait_until(lambda: open_incidents(call, cluster), 60, f"an incident for the frozen {host}")
    assert [(i["kind"], i["culprit"], i["network_ok"]) for i in named] == [("host", host, True)], named
    fab.heal(stall)
    wait_until(lambda: open_incidents(call, cluster) == [], 90, "the host's incident to resolve after the thaw")

    # a flapping cable (down 2 s, up 2 s): one incident that stays open across the flaps
    flap = fab.fault_link_flap(cables[1], period=4.0, duty=0.5)
    truth = fab.ground_truth()["culprits"]
    named = wait_until(lambda: [i for i in open_incidents(call, cluster) if i["windows"] >= 4], 90,
                       f"an incident for the flapping {cables[1]} named in four windows")
    assert [(i["kind"], i["culprit"]) for i in named] == [(truth[0]["kind"], truth[0]["name"])], (named, truth)
    same = call("GET", "incidents/", params={"cluster": cluster.pk, "culprit": truth[0]["name"]}).json()["results"]
    assert len(same) == 1 and same[0]["reopened"] == 0
    fab.heal(flap)
    wait_until(lambda: open_incidents(call, cluster) == [], 90, "the flap's incident to resolve once healed")
