"""Agents in every host namespace reach a console on the management network; stop, restart,
freeze and thaw them. Uses a stand-in agent process that reports what it was given and a stub
console (an HTTP server in the root namespace on the management bridge address); the real agent
and console in namespaces: tests/integration/test_demo.py."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from testbed import procs
from testbed.agents import machine_id
from testbed.testing import wait_for

pytestmark = pytest.mark.netns
STANDIN = ["{python}", str(Path(__file__).with_name("standin_agent.py"))]


@pytest.fixture
def console(small_fabric):
    posts: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posts.append(body | {"t": time.monotonic(), "path": self.path})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"node_state": "ready"}')

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((small_fabric.bridge_address, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], posts
    server.shutdown()
    server.server_close()


def heard(posts, host, since):
    return [p for p in posts if p["hostname"] == host and p["t"] > since]


def test_agents_start_enroll_freeze_thaw_restart_and_stop(small_fabric, console):
    fab = small_fabric
    port, posts = console
    url = fab.console_url(port)
    started = fab.start_agents(console_url=url, token="lse_testtesttest.secret", cluster_id=7, argv=STANDIN)
    try:
        assert sorted(started) == fab.hosts
        t0 = time.monotonic() - 1
        wait_for(lambda: all(heard(posts, h, t0) for h in fab.hosts), 15, "a post from every host's agent")
        for host in fab.hosts:
            p = heard(posts, host, t0)[-1]
            assert p["path"] == "/api/v1/agent/heartbeat"
            assert p["machine_id"] == machine_id(fab.prefix, host) and len(p["machine_id"]) == 32
            assert p["token"] == "lse_testtesttest.secret" and p["cluster_id"] == "7"
            assert p["state_dir"].endswith(f"agents/{host}/state") and p["starts"] == 1
            assert p["pid"] == fab.agents()[host]["pid"]
        assert len({p["machine_id"] for p in posts}) == len(fab.hosts)

        # freeze one agent: it goes silent while the others keep posting; thaw resumes it
        assert fab.freeze_agents(["node0001"]) == ["node0001"]
        assert fab.agents()["node0001"]["frozen"]
        time.sleep(0.3)  # let an in-flight post land
        t1 = time.monotonic()
        wait_for(lambda: heard(posts, "node0000", t1 + 0.5), 10, "node0000 keeps posting")
        assert heard(posts, "node0001", t1) == []
        fab.thaw_agents(["node0001"])
        t2 = time.monotonic()
        wait_for(lambda: heard(posts, "node0001", t2), 10, "node0001 posts again after thaw")

        # a host stall freezes the agent too
        fid = fab.fault_host_stall("node0002")
        time.sleep(0.3)
        t3 = time.monotonic()
        wait_for(lambda: heard(posts, "node0003", t3 + 0.5), 10, "node0003 keeps posting")
        assert heard(posts, "node0002", t3) == []
        assert fab.agents()["node0002"]["frozen"]
        fab.heal(fid)
        t4 = time.monotonic()
        wait_for(lambda: heard(posts, "node0002", t4), 10, "node0002 posts after the stall")

        # restart: a new process, same identity and state directory
        old = fab.agents()["node0003"]["pid"]
        fab.restart_agents(["node0003"])
        new = fab.agents()["node0003"]["pid"]
        assert new != old
        t5 = time.monotonic()
        p = wait_for(lambda: heard(posts, "node0003", t5), 10, "node0003 after restart")[-1]
        assert p["pid"] == new and p["starts"] == 2 and p["machine_id"] == machine_id(fab.prefix, "node0003")
        assert "stand-in agent node0003" in Path(fab.agents()["node0003"]["log"]).read_text()
    finally:
        records = dict(fab.refresh().state["agents"])
        stopped = fab.stop_agents()
    assert sorted(stopped) == fab.hosts
    assert not any(procs.alive(r["pid"], r["start"]) for r in records.values())
    assert fab.agents() == {}
    t6 = time.monotonic() + 0.3
    time.sleep(0.6)
    assert [p for p in posts if p["t"] > t6] == []
