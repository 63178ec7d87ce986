"""`manage.py serve` stops cleanly on Ctrl-C while agents hold long polls: every held poll is
answered (empty) at once, the process exits 0, and nothing is printed as a traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import pytest
import requests

from console.fleet.models import Cluster, Node, NodeState
from console.fleet.services import enroll
from console.tenancy.models import Organization
from tests.factories import make_enrollment_token
from tests.integration.conftest import Process, free_port, process_env, wait_until

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_answers_the_held_polls_and_stops_without_a_traceback(transactional_db, tmp_path, signum):
    organization = Organization.objects.create(name="Shutdown", slug="shutdown")
    cluster = Cluster.objects.create(organization=organization, name="c")
    token = make_enrollment_token(cluster, max_uses=10)
    nodes = [enroll(token, {"hostname": f"n{i}", "machine_id": f"m{i}"}) for i in range(3)]
    port = free_port()
    server = Process([sys.executable, "manage.py", "serve", "--port", str(port)],
                     process_env(LOCKSTEP_AGENT_POLL_MAX_WAIT_S="60"), tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    answers: dict[int, requests.Response | Exception] = {}

    def hold(i: int, credential: str) -> None:
        try:
            answers[i] = requests.get(f"{base}/api/v1/agent/commands?wait=50", timeout=60,
                                      headers={"Authorization": f"Bearer {credential}"})
        except Exception as exc:  # reported by the assertions below
            answers[i] = exc

    try:
        wait_until(lambda: requests.get(f"{base}/healthz", timeout=1).ok, 30, "the console to start")
        threads = [threading.Thread(target=hold, args=(i, n.credential), daemon=True) for i, n in enumerate(nodes)]
        for thread in threads:
            thread.start()
        # each poll authenticated (its node turned ready) and is now held
        wait_until(lambda: set(Node.objects.filter(cluster=cluster).values_list("state", flat=True))
                   == {NodeState.READY}, 30, "the three polls to be held")
        server.proc.send_signal(signum)
        code = server.proc.wait(30)
        for thread in threads:
            thread.join(30)
    finally:
        server.stop()
    output = server.output()
    assert code == 0, output[-3000:]
    assert "Traceback" not in output and "Cancel" not in output and "Exception" not in output, output[-3000:]
    for i in range(3):
        answer = answers[i]
        assert isinstance(answer, requests.Response), answer
        assert answer.status_code == 200 and answer.json() == {"commands": []}


def test_the_asgi_app_loads_the_channel_layer_before_the_first_request_threads_race_to_import_it(db):
    # Two request threads importing channels_redis at once deadlocked on redis's circular
    # import (a CI run's shutdown test caught it): building the ASGI app imports it first.
    probe = ("import json, sys; import console.asgi; from channels.layers import channel_layers; "
             "print(json.dumps({'layers': sorted(channel_layers.backends), "
             "'redis': 'channels_redis.core' in sys.modules}))")
    env = process_env()
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded["layers"] == ["default"]
    assert loaded["redis"] == bool(env.get("REDIS_URL"))
