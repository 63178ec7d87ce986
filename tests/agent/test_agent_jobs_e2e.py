"""End to end: a real ``lockstep run`` job (4 ranks, gloo, a script that checkpoints with
``lockstep.checkpoint.save``), a real agent whose local socket the job's orchestrator and
checkpoint writer send their events to, and the real console (uvicorn on the test database):
``lockstep snapshot`` of the running job, then the job, its checkpoints and its snapshot are
in the console's REST API, as the organization's member sees them."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import requests
from agent_testlib import wait_for
from django.conf import settings

from console.tenancy import services as tenancy
from console.tenancy.models import Membership, Role, TokenScope
from tests.lockstep.lockstep_helpers import Job

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(600),
    # Four training processes and a console: once per CI run, on the PostgreSQL suite.
    pytest.mark.skipif(settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"),
                       reason="runs on the PostgreSQL suite only (a 4-rank job per run is enough)"),
]


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(prefix="ls-jobs-", dir="/tmp"))  # a Unix socket path is short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_job_its_checkpoints_and_snapshot_appear_in_the_console_api(real_console, start_daemon, short_dir, tmp_path,
                                                                     django_user_model):
    console = real_console
    sock = short_dir / "agent.sock"
    running = start_daemon(console, enroll_token=console.create_token(), agent_socket=str(sock))
    node = running.daemon.cred.node_id
    wait_for(lambda: console.node(node).state == "ready", 15, "the node to be ready")
    user = django_user_model.objects.create_user(username="dana", password="pw-dana")
    Membership.objects.create(organization=console.organization, user=user, role=Role.VIEWER)
    token = tenancy.mint_api_token(console.organization.pk, user, name="dana", scope=TokenScope.READ).plaintext

    def api(path):
        response = requests.get(f"{console.url}/api/v1/{path}", headers={"Authorization": f"Bearer {token}"},
                                timeout=10)
        assert response.ok, response.text
        return response.json()["results"]

    job = Job(tmp_path, "mlp_checkpointing.py", ["12", str(tmp_path / "ckpt")],
              env={"LOCKSTEP_AGENT_SOCKET": str(sock), "LOCKSTEP_HEARTBEAT_EVENT_S": "1"})
    try:
        job.wait_step(5)
        done = job.cli("snapshot", "--job", job.name, timeout=300)
        assert done.returncode == 0, done.stderr + job.output[-3000:]
        sid = re.match(r"snapshot (\S+) of job", done.stdout).group(1)
        assert job.wait() == 0, job.output[-4000:]
    finally:
        job.close()

    (row,) = wait_for(lambda: api(f"jobs/?name={job.name}") or None, 60, "the job in the API")
    assert row["node"] == node and row["world_size"] == 4 and row["cluster"] == console.cluster.pk
    snapshots = wait_for(lambda: api(f"job-captures/?job={row['id']}&kind=snapshot") or None, 60,
                         "the snapshot in the API")
    manifest = json.loads((Path(snapshots[0]["path"]) / "manifest.json").read_text())
    assert [(s["identifier"], s["step"], s["bytes"]) for s in snapshots] == [(sid, manifest["step"], manifest["bytes"])]
    checkpoints = wait_for(lambda: [c for c in api(f"job-captures/?job={row['id']}&kind=checkpoint")
                                    if c["path"].endswith("/final")] and api(f"job-captures/?job={row['id']}&kind=checkpoint"),
                           60, "the checkpoints in the API")
    paths = {c["path"] for c in checkpoints}
    on_disk = {str(p) for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith(".")}
    assert paths == on_disk, (paths, on_disk)
    assert all(c["bytes"] > 0 and c["paused_s"] is not None for c in checkpoints)
