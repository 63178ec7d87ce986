"""The real install.sh, fetched with curl from a live console and run in a fresh network namespace.

The node namespace reaches the console through a veth pair; the installer installs under
``--root`` (an empty directory) so this machine's /opt, /etc, /var and /run stay untouched; the
agent runs under the installer's supervisor (no systemd here), inside the namespace.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import requests
from django.utils import timezone

from console.fleet.install_command import TOKEN_FILE
from console.fleet.models import Cluster, EnrollmentToken
from tests.factories import make_enrollment_token
from tests.installer.installer_lib import (
    alive,
    files_containing,
    leftovers,
    pid_of,
    python_args,
    snapshot,
    token_file,
    wait_gone,
)
from tests.integration.conftest import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(300)]

HOSTNAME = "lsi-node-01"


def api(world, console, method, path, **kwargs):
    headers = {"Authorization": f"Bearer {world.token('alice')}"}
    response = requests.request(method, f"{console.url}/api/v1{path}", headers=headers, timeout=15, **kwargs)
    assert response.status_code < 300, f"{method} {path}: {response.status_code} {response.text}"
    return response.json()


def flags(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in (*args, *python_args()))


def installer(console, *args: str) -> str:
    """The operator's line without sudo (the namespace runs as root) and with the test flags."""
    return f"curl -fsSL {console.url}/install.sh | sh -s -- {flags(*args)}"


def enrollment(world, console, **fields) -> tuple[int, str, str]:
    cluster = api(world, console, "POST", "/clusters/", json={"name": "lsi-cluster"})
    answer = api(world, console, "POST", f"/clusters/{cluster['id']}/enrollment-tokens/", json=fields)
    return cluster["id"], answer["token"], answer["install_command_token_file"]


class CommandLineWatch:
    """Reads every process's command line (world-readable /proc/*/cmdline) until stopped, and
    keeps those that hold `secret`: what any other user of the node could have read."""

    def __init__(self, secret: str):
        self.secret = secret.encode()
        self.seen: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    raw = cmdline.read_bytes()
                except OSError:
                    continue
                if self.secret in raw:
                    self.seen.append(raw.replace(b"\0", b" ").decode(errors="replace"))
            self.scans += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def assert_untouched(node_ns, root, result) -> None:
    assert leftovers(root) == [], f"the failed install left files behind\n{result}"
    assert node_ns.pids() == [], f"the failed install left processes behind\n{result}"


def test_install_enrolls_the_node_rerun_changes_nothing_and_uninstall_removes_everything(
    world, ns_console, node_ns, install_root
):
    root = str(install_root)
    cluster_id, token, line = enrollment(world, ns_console, max_uses=1)
    assert line == f"curl -fsSL {ns_console.url}/install.sh | sudo sh -s -- --token-file {TOKEN_FILE}"
    assert token not in line
    # The operator's token file (here under the test's directory, not this machine's /root).
    _, token_path = token_file(token)
    line = line.replace(TOKEN_FILE, token_path)

    # The line the console printed, as an operator pastes it (root already: no sudo here), while
    # another user of the node reads every command line: the token is in none of them.
    with CommandLineWatch(token.split(".", 1)[1]) as watch:
        first = node_ns.sh(f"{line.replace('| sudo sh', '| sh')} {flags('--root', root, '--hostname', HOSTNAME)}")
    assert first.rc == 0, first
    assert watch.scans > 0 and watch.seen == [], watch.seen
    assert "systemd is not running on this host: the agent runs under a small supervisor" in first.out, first

    def ready_node():
        nodes = api(world, ns_console, "GET", f"/nodes/?cluster={cluster_id}")["results"]
        return next((n for n in nodes if n["name"] == HOSTNAME and n["state"] == "ready" and n["inventory_at"]),
                    None)

    node = wait_until(ready_node, 30, "the node to be ready with its inventory")
    assert node["hostname"] == HOSTNAME and node["agent_version"] == "0.1.0" and node["gpu_count"] == 0
    nics = wait_until(lambda: api(world, ns_console, "GET", f"/nics/?node={node['id']}")["results"], 15,
                      "the node's NICs")
    assert [n["device"] for n in nics] == [node_ns.node_if]  # the namespace's own interface, seen from its sysfs
    assert nics[0]["addresses"][0] == f"{node_ns.node_ip}/30"

    env_file = install_root / "etc/lockstep/agent.env"
    assert env_file.stat().st_mode & 0o777 == 0o600 and env_file.stat().st_uid == 0
    assert env_file.read_text().splitlines()[2:] == [
        f"LOCKSTEP_CONSOLE_URL={ns_console.url}", f"LOCKSTEP_STATE_DIR={root}/var/lib/lockstep",
        f"LOCKSTEP_HOSTNAME={HOSTNAME}", f"LOCKSTEP_AGENT_SOCKET={root}/run/lockstep/agent.sock",
    ]
    credential = install_root / "var/lib/lockstep/credential.json"
    assert credential.stat().st_mode & 0o777 == 0o600
    assert (install_root / "var/lib/lockstep").stat().st_mode & 0o777 == 0o700
    assert files_containing(install_root, token.split(".", 1)[1].encode()) == [], "the enrollment token was kept"
    unit = install_root / "etc/systemd/system/lockstep-agent.service"
    assert not unit.exists()

    supervisor, agent = pid_of(install_root / "run/lockstep/supervisor.pid"), pid_of(install_root / "run/lockstep/agent.pid")
    assert alive(supervisor) and alive(agent)
    # This node's Python and CPU have a clock-sync build: numpy and scipy came with it, offline.
    venv_python = install_root / "opt/lockstep/venv/bin/python"
    estimator = subprocess.run([str(venv_python), "-m", "agent.clocksync.estimate", "--help"], capture_output=True,
                               text=True, check=False, env={"PATH": "/usr/bin:/bin"})
    assert estimator.returncode == 0, estimator.stderr
    assert set(node_ns.pids()) == {supervisor, agent}
    before = snapshot(install_root)

    # Again, the same line: the token (max_uses=1, used) is not needed, nothing is rewritten,
    # the agent is not restarted.
    again = node_ns.sh(f"{line.replace('| sudo sh', '| sh')} {flags('--root', root, '--hostname', HOSTNAME)}")
    assert again.rc == 0, again
    assert "nothing changed: not restarted" in again.out and "nothing needed to change" in again.out, again
    assert snapshot(install_root) == before
    assert set(node_ns.pids()) == {supervisor, agent} and alive(agent)
    assert EnrollmentToken.objects.get().uses == 1

    # A dry run of an installed node: nothing to do, nothing touched.
    dry = node_ns.sh(installer(ns_console, "--dry-run", "--root", root, "--hostname", HOSTNAME))
    assert dry.rc == 0 and "is installed and current" in dry.out and "agent.env is current" in dry.out, dry
    assert snapshot(install_root) == before

    gone = node_ns.sh(installer(ns_console, "--uninstall", "--root", root))
    assert gone.rc == 0, gone
    assert "uninstalled the Lockstep agent" in gone.out
    wait_gone([supervisor, agent])
    assert node_ns.pids() == []
    assert leftovers(install_root) == [], "the uninstall left files or directories behind"
    again = node_ns.sh(installer(ns_console, "--uninstall", "--root", root))
    assert again.rc == 0 and "nothing to uninstall" in again.out, again


def test_a_changed_setting_is_written_and_the_agent_restarted_once(world, ns_console, node_ns, install_root):
    root = str(install_root)
    _, token, _ = enrollment(world, ns_console)
    first = node_ns.sh(installer(ns_console, *token_file(token), "--root", root, "--hostname", HOSTNAME))
    assert first.rc == 0, first
    env_file = install_root / "etc/lockstep/agent.env"
    with env_file.open("a") as fh:  # an operator's own key survives re-runs
        fh.write("LOCKSTEP_LOG_LEVEL=debug\n")
    agent = pid_of(install_root / "run/lockstep/agent.pid")
    venv_target = (install_root / "opt/lockstep/venv").readlink()

    changed = node_ns.sh(installer(ns_console, "--root", root, "--hostname", "lsi-node-01b"))
    assert changed.rc == 0, changed
    assert f"wrote {env_file}" in changed.out and "not restarted" not in changed.out, changed
    assert "LOCKSTEP_HOSTNAME=lsi-node-01b" in env_file.read_text()
    assert "LOCKSTEP_LOG_LEVEL=debug" in env_file.read_text()
    wait_gone([agent])
    new_agent = pid_of(install_root / "run/lockstep/agent.pid")
    assert alive(new_agent) and new_agent != agent
    assert (install_root / "opt/lockstep/venv").readlink() == venv_target  # same package: same venv
    assert len(node_ns.pids()) == 2


def test_a_wrong_token_exits_30_and_leaves_the_node_as_it_was(world, ns_console, node_ns, install_root):
    enrollment(world, ns_console)
    wrong = "lse_AAAAAAAAAAAA.not-the-secret-of-any-token"
    result = node_ns.sh(installer(ns_console, *token_file(wrong), "--root", str(install_root), "--hostname", HOSTNAME))
    assert result.rc == 30, result
    assert "enrollment_token_invalid" in result.err and "Copy the install line again" in result.err, result
    assert_untouched(node_ns, install_root, result)


def test_an_expired_token_exits_30_and_leaves_the_node_as_it_was(world, ns_console, node_ns, install_root):
    cluster = Cluster.objects.create(organization=world.acme, name="lsi-expired")
    token = make_enrollment_token(cluster, expires=timezone.now() - timedelta(minutes=5))
    result = node_ns.sh(installer(ns_console, *token_file(token), "--root", str(install_root), "--hostname", HOSTNAME))
    assert result.rc == 30, result
    assert "enrollment_token_expired" in result.err and "Create a new enrollment token" in result.err, result
    assert_untouched(node_ns, install_root, result)


def test_an_unreachable_console_exits_20_and_leaves_the_node_as_it_was(world, ns_console, node_ns, install_root):
    _, token, _ = enrollment(world, ns_console)
    dead = f"http://{node_ns.host_ip}:9"  # nothing listens there: connection refused
    result = node_ns.sh(installer(ns_console, *token_file(token), "--console", dead, "--root", str(install_root)))
    assert result.rc == 20, result
    assert f"cannot reach the console to download {dead}/agent/" in result.err, result
    assert "Check the console URL and that this node can reach it" in result.err
    assert_untouched(node_ns, install_root, result)


def test_a_tampered_package_exits_22_and_leaves_the_node_as_it_was(
    world, ns_console, node_ns, install_root, tamper_proxy, node_package
):
    _, token, _ = enrollment(world, ns_console)
    # The script comes from the console; the package (and a matching .sha256) from the proxy.
    result = node_ns.sh(installer(ns_console, *token_file(token), "--console", tamper_proxy.url,
                                  "--root", str(install_root)))
    assert result.rc == 22, result
    assert f"checksum mismatch: {node_package.filename}" in result.err, result
    assert f"this installer expects {node_package.sha256}" in result.err
    assert any(p.endswith(".tar.gz") for p in tamper_proxy.served), tamper_proxy.served
    assert_untouched(node_ns, install_root, result)
    assert EnrollmentToken.objects.get().uses == 0


def test_a_dry_run_changes_nothing(world, ns_console, node_ns, install_root):
    _, token, _ = enrollment(world, ns_console)
    result = node_ns.sh(installer(ns_console, *token_file(token), "--dry-run", "--root", str(install_root),
                                  "--hostname", HOSTNAME))
    assert result.rc == 0, result
    for step in ("would download", "would create the virtual environment", "would write", "would enroll",
                 "would start the agent under the supervisor"):
        assert step in result.out, result
    assert token not in result.out + result.err, "the dry run printed the token"
    assert_untouched(node_ns, install_root, result)
    assert EnrollmentToken.objects.get().uses == 0


def test_a_token_alone_does_not_take_over_an_enrolled_node_its_own_credential_re_enrolls_it(
    world, ns_console, node_ns, install_root, tmp_path
):
    # Issue 9, finding 1: the machine id is no secret (/etc/machine-id, the nodes API). A second
    # installation (another root: another machine reporting the same machine id and host name)
    # holding a token must not get the node, its credential or its commands.
    root = str(install_root)
    cluster_id, token, _ = enrollment(world, ns_console, max_uses=5)
    first = node_ns.sh(installer(ns_console, *token_file(token), "--root", root, "--hostname", HOSTNAME))
    assert first.rc == 0, first
    credential = (install_root / "var/lib/lockstep/credential.json").read_text()
    node = api(world, ns_console, "GET", f"/nodes/?cluster={cluster_id}")["results"][0]

    impostor_root = tmp_path / "impostor"
    impostor_root.mkdir()
    impostor = node_ns.sh(installer(ns_console, *token_file(token), "--root", str(impostor_root),
                                    "--hostname", HOSTNAME))
    assert impostor.rc == 31, impostor
    assert "node_already_enrolled" in impostor.err and "reset the node's credential" in impostor.err, impostor
    assert leftovers(impostor_root) == []
    assert (install_root / "var/lib/lockstep/credential.json").read_text() == credential  # still the node's

    # The node itself re-enrolls: its current credential proves it.
    again = node_ns.sh(installer(ns_console, *token_file(token), "--reenroll", "--root", root, "--hostname", HOSTNAME))
    assert again.rc == 0, again
    renewed = (install_root / "var/lib/lockstep/credential.json").read_text()
    assert renewed != credential and json.loads(renewed)["node_id"] == node["id"]

    # After an operator resets the node, a token enrolls it again (here: the other installation).
    api(world, ns_console, "POST", f"/nodes/{node['id']}/reset-credential/")
    taken = node_ns.sh(installer(ns_console, *token_file(token), "--root", str(impostor_root), "--hostname", HOSTNAME))
    assert taken.rc == 0, taken
    node_ns.sh(installer(ns_console, "--uninstall", "--root", str(impostor_root)))
