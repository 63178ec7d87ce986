"""`python -m testbed`: help for every option, clear errors, and a whole session driven by the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import netops
from testbed.plan import ns_re

REPO = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("standin_agent.py")


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "testbed", *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("command, expected", [
    ([], ["up", "down", "status", "fault", "heal", "agents", "simulate", "--prefix", "--state-dir"]),
    (["up"], ["--topology", "--hosts", "--rails", "--hosts-per-leaf", "--spines", "--links-per-spine",
              "--mgmt-subnet", "--fault-log", "--write-topology"]),
    (["down"], ["--all"]),
    (["status"], ["--json"]),
    (["fault"], ["link-down", "link-flap", "link-loss", "link-rate", "switch-loss", "nic-down", "host-stall",
                 "list", "log", "truth"]),
    (["fault", "link-down"], ["--no-reroute"]),
    (["fault", "link-flap"], ["--period", "--duty"]),
    (["fault", "link-loss"], ["--rate", "--direction"]),
    (["fault", "link-rate"], ["--mbit", "--direction", "--burst-kb", "--latency-ms"]),
    (["fault", "switch-loss"], ["--rate"]),
    (["heal"], ["FAULT_ID", "--all"]),
    (["agents"], ["start", "stop", "restart", "freeze", "thaw", "status"]),
    (["agents", "start"], ["--console-url", "--console-port", "--token", "--cluster-id", "--cmd", "--env"]),
])
def test_help_explains_every_option(command, expected):
    out = cli(*command, "--help")
    assert out.returncode == 0, out.stderr
    for word in expected:
        assert word in out.stdout, (command, word)


# The CLI as another user. The checkout may sit in a directory only root can read (a clone in
# `mktemp -d`, mode 0700), so the child imports it while still root, then drops to `nobody`
# before `main` runs: the root check sees a non-root user, exactly as `python -m testbed` would.
AS_NOBODY = """
import os, sys
import testbed.cli
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
assert os.geteuid() == 65534
sys.argv = ["testbed", *sys.argv[1:]]
sys.exit(testbed.cli.main())
"""


def test_clear_error_when_not_root():
    if os.geteuid() == 0:
        out = subprocess.run([sys.executable, "-c", AS_NOBODY, "status"], cwd=REPO, capture_output=True, text=True,
                             timeout=120, env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"})
    else:
        out = cli("status")
    assert out.returncode == 1, out.stderr
    assert "needs root" in out.stderr and "Traceback" not in out.stderr


def test_clear_error_when_iproute2_is_missing():
    if os.geteuid() != 0:
        pytest.skip("checked after the root check")
    out = cli("status", env={"PATH": "/nonexistent"})
    assert out.returncode == 1 and "`ip` (iproute2) is not installed" in out.stderr


def test_simulate_is_reached_through_the_testbed_cli():
    out = cli("simulate", "topology", "--help")
    assert out.returncode == 0 and "--hosts" in out.stdout


@pytest.mark.netns
def test_a_whole_session_through_the_cli(base_dir, prefix, tmp_path):
    common = ["--prefix", prefix, "--state-dir", str(base_dir)]
    topo = tmp_path / "topo.json"
    out = cli(*common, "up", "--hosts", "2", "--rails", "1", "--hosts-per-leaf", "2", "--spines", "1",
              "--write-topology", str(topo))
    assert out.returncode == 0, out.stderr
    assert "2 hosts, 2 switches, 3 links" in out.stdout
    assert json.loads(topo.read_text())["format"] == "lockstep.topology/v1"
    try:
        out = cli(*common, "status")
        assert out.returncode == 0 and "node0001" in out.stdout and "leaf-su00-r0" in out.stdout
        status = json.loads(cli(*common, "status", "--json").stdout)
        assert [h["name"] for h in status["hosts"]] == ["node0000", "node0001"]

        out = cli(*common, "fault", "link-loss", "node0000/nic0~leaf-su00-r0", "--rate", "0.3",
                  "--direction", "node0000/nic0")
        assert out.returncode == 0 and out.stdout.strip() == "f1"
        assert "f1 link-loss nic:node0000/nic0" in cli(*common, "fault", "list").stdout
        truth = json.loads(cli(*common, "fault", "truth").stdout)
        assert truth["culprits"] == [{"kind": "nic", "name": "node0000/nic0", "confidence": 1.0}]
        out = cli(*common, "fault", "link-loss", "no-such-link", "--rate", "0.1")
        assert out.returncode == 1 and out.stderr.startswith("error:") and "no-such-link" in out.stderr
        assert cli(*common, "fault", "host-stall", "node0001").stdout.strip() == "f2"
        out = cli(*common, "heal", "--all")
        assert out.returncode == 0 and "f1" in out.stdout and "f2" in out.stdout
        events = [json.loads(line) for line in cli(*common, "fault", "log").stdout.splitlines()]
        assert [(e["id"], e["event"]) for e in events] == [("f1", "start"), ("f2", "start"),
                                                             ("f1", "end"), ("f2", "end")]

        out = cli(*common, "exec", "node0000", "--", "ip", "-br", "addr", "show", "dev", "nic0")
        assert out.returncode == 0 and "172.16.0.1/31" in out.stdout

        out = cli(*common, "agents", "start", "--token", "lse_a.b", "--cmd", f"{{python}} {STANDIN}")
        assert out.returncode == 0 and "started 2 agents" in out.stdout
        assert cli(*common, "agents", "freeze", "node0000").stdout.strip() == "frozen: node0000"
        out = cli(*common, "agents", "status").stdout
        assert "node0000" in out and "frozen" in out and "node0001" in out
        assert cli(*common, "agents", "thaw").stdout.strip() == "thawed: node0000, node0001"
        assert cli(*common, "agents", "stop").stdout.strip() == "stopped: node0000, node0001"
    finally:
        out = cli(*common, "down")
    assert out.returncode == 0, out.stderr
    assert not [ns for ns in netops.list_netns() if ns_re(prefix).match(ns)]
    out = cli(*common, "status")
    assert out.returncode == 1 and "no testbed with prefix" in out.stderr
