"""`make demo`'s command end to end: an emulated cluster with real agents, a fault the console
sees, and a clean teardown on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
import requests

from testbed.netops import netns_problem
from tests.integration.conftest import ROOT, Process, free_port, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["emulated", "simulated"])
def test_the_demo_shows_a_fault_and_cleans_up(tmp_path, mode):
    if mode == "emulated" and netns_problem() is not None:
        pytest.skip(f"the emulated demo needs root and network namespaces: {netns_problem()}")
    port, prefix = free_port(), f"dm{os.getpid() % 10000}"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(LOCKSTEP_VAR_DIR=str(tmp_path / "var"), LOCKSTEP_NODE_LOST_AFTER_S="6",
               LOCKSTEP_AGENT_HEARTBEAT_INTERVAL_S="2", LOCKSTEP_SWEEP_INTERVAL_S="1", PYTHONUNBUFFERED="1",
               LOCKSTEP_TESTBED_DIR=str(tmp_path / "testbed"))
    demo = Process([sys.executable, "manage.py", "demo", "--port", str(port), "--hosts", "2", "--rails", "1",
                    "--fault-every", "8", "--fault-for", "15", "--prefix", prefix,
                    "--faults", "host-stall", *(["--simulated"] if mode == "simulated" else [])], env, tmp_path / "demo.log")
    base = f"http://127.0.0.1:{port}"
    try:
        session = requests.Session()

        def logged_in():
            session.get(f"{base}/login/", timeout=2)
            response = session.post(f"{base}/login/", timeout=5, headers={"Referer": f"{base}/login/"},
                                    data={"username": "demo", "password": "lockstep-demo",
                                          "csrfmiddlewaretoken": session.cookies["csrftoken"]})
            return response.ok and response.url.endswith("/clusters/")

        wait_until(logged_in, 120, "the demo console to accept the demo login")

        def states():
            return {n["name"]: n["state"] for n in session.get(f"{base}/api/v1/nodes/", timeout=5).json()["results"]}

        wait_until(lambda: set(states().values()) == {"ready"} and len(states()) == 2, 90, "both agents ready")
        frozen = wait_until(lambda: re.search(r"froze host (\S+)", demo.output()), 90, "a host stall")
        wait_until(lambda: states()[frozen.group(1)] == "lost", 60, f"{frozen.group(1)} to be lost")
        wait_until(lambda: states()[frozen.group(1)] == "ready", 90, f"{frozen.group(1)} to recover")
    finally:
        if demo.proc.poll() is None:
            demo.proc.send_signal(signal.SIGTERM)
            demo.proc.wait(60)
        output = demo.output()
        demo.stop()
    assert demo.proc.returncode == 0, output[-2000:]
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, cwd=ROOT).stdout
    assert f"{prefix}-" not in namespaces
