"""The real console, behind the interface of ``fake_console.FakeConsole`` (see ``conftest.py``).

A uvicorn process serves the console on the test database (PostgreSQL and Redis when
``DATABASE_URL``/``REDIS_URL`` are set); the test process reads and writes the same database
through the ORM. ``stop()`` ends the process (SIGTERM, one second of grace), ``start()`` starts
a new one on the same port and database: the console goes away and comes back.

Differences from the fake, because the real console does not record them:
``heartbeats(node)`` is the last heartbeat only (``Node.agent_status``); a command's
``deliveries`` is its ``attempt``, ``result_posts`` is unknown (None); ``requests()`` and
``inject()`` raise (the real console has no fault injection: use the fake for those tests).
Commands are queued straight into the database, so test command types (``test.record``)
need no console-side registration, and ``cluster_id`` arguments name real cluster ids (the
default is the adapter's own cluster).
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import requests
from django.utils import timezone

from console.commands import wakeup
from console.commands.models import Command, CommandState
from console.fleet import services as fleet_services
from console.fleet.models import Cluster, EnrollmentToken, Node, NodeCredential
from console.telemetry.models import TelemetryBatch, TelemetryRecord
from console.tenancy.models import Organization
from tests.integration.conftest import Process, free_port, process_env, wait_until

# Short intervals so the tests run in seconds: a heartbeat a second, polls held two seconds,
# a poll re-checks the database every second (no Redis wake-up across processes on SQLite).
CONSOLE_ENV = {
    "LOCKSTEP_AGENT_HEARTBEAT_INTERVAL_S": "1",
    "LOCKSTEP_AGENT_POLL_MAX_WAIT_S": "7",
    "LOCKSTEP_AGENT_POLL_RECHECK_S": "1",
}
FINAL = {CommandState.SUCCEEDED, CommandState.FAILED, CommandState.EXPIRED, CommandState.CANCELLED}


class RealConsole:
    def __init__(self, log_dir: Path, host: str = "127.0.0.1", port: int | None = None, **env: str):
        self.host = host
        self.port = port or free_port()
        self.url = f"http://{host}:{self.port}"
        self.log_dir = log_dir
        self.env = {**CONSOLE_ENV, **env}
        self.server: Process | None = None
        self.starts = 0
        self.organization = Organization.objects.create(name="Agent tests", slug="agent-tests")
        self.cluster = Cluster.objects.create(organization=self.organization, name="agent-tests")

    # -- the process -------------------------------------------------------------------------

    def start(self) -> RealConsole:
        assert self.server is None, "the console is already running"
        self.starts += 1
        self.server = Process(
            [sys.executable, "-m", "uvicorn", "tests.agent.console_app:application", "--host", self.host, "--port",
             str(self.port), "--lifespan", "off", "--timeout-graceful-shutdown", "1"],
            process_env(**self.env), self.log_dir / f"console-{self.starts}.log",
        )
        wait_until(lambda: requests.get(f"{self.url}/healthz", timeout=1).ok, 30, "the console to start")
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("console-*.log")))

    # -- tokens and nodes ---------------------------------------------------------------------

    def _cluster(self, cluster_id: int | None) -> Cluster:
        return self.cluster if cluster_id is None else Cluster.objects.get(pk=cluster_id)

    def create_token(self, cluster_id: int | None = None, expires_in_s: float = 3600, max_uses=None) -> str:
        return fleet_services.mint_enrollment_token(self._cluster(cluster_id), max_uses=max_uses,
                                                    lifetime=timedelta(seconds=expires_in_s)).plaintext

    def revoke_token(self, token: str) -> None:
        EnrollmentToken.objects.filter(pk=EnrollmentToken.lookup(token).pk).update(revoked_at=timezone.now())

    def expire_token(self, token: str) -> None:
        EnrollmentToken.objects.filter(pk=EnrollmentToken.lookup(token).pk).update(
            expires=timezone.now() - timedelta(seconds=1))

    def add_node(self, cluster_id: int | None, hostname: str, machine_id: str = "", state: str = "ready") -> int:
        cluster = self._cluster(cluster_id)
        return Node.objects.create(organization=cluster.organization, cluster=cluster, name=hostname,
                                   hostname=hostname, machine_id=machine_id, state=state).pk

    def revoke_credential(self, node_id: int) -> None:
        NodeCredential.objects.filter(node_id=node_id, revoked_at__isnull=True).update(revoked_at=timezone.now())

    def retire(self, node_id: int) -> None:
        fleet_services.retire(Node.objects.get(pk=node_id))

    def node(self, node_id: int) -> Node:
        return Node.objects.get(pk=node_id)

    def node_by_name(self, name: str) -> Node | None:
        return Node.objects.filter(cluster=self.cluster, name=name).first()

    # -- commands ------------------------------------------------------------------------------

    def enqueue(self, node_id: int, type: str, args: dict | None = None, timeout_s: float = 60) -> str:
        node = Node.objects.get(pk=node_id)
        command = Command.objects.create(organization_id=node.organization_id, cluster_id=node.cluster_id, node=node,
                                         type=type, args=args or {}, timeout_s=max(1, round(timeout_s)))
        wakeup.notify(node_id)  # reaches the server through Redis; on SQLite its poll re-checks
        return str(command.pk)

    def redeliver(self, command_id: str) -> None:
        """End the command's lease now: the next poll of its node gets it again (attempt + 1)."""
        updated = Command.objects.filter(pk=command_id, state=CommandState.DELIVERED).update(
            lease_expires=timezone.now() - timedelta(seconds=1))
        assert updated == 1, f"command {command_id} is not delivered ({Command.objects.get(pk=command_id).state})"

    def command(self, command_id: str) -> SimpleNamespace:
        c = Command.objects.get(pk=command_id)
        return SimpleNamespace(state=c.state, attempt=c.attempt, deliveries=c.attempt,
                               status=c.state if c.state in FINAL else "", result=c.result, error=c.error,
                               result_posts=None)

    # -- what the agent sent -------------------------------------------------------------------

    def telemetry_records(self, node_id: int) -> list[dict]:
        """Records as stored, in the order the agent sent them (batch sequence, then position)."""
        rows = TelemetryRecord.objects.filter(node_id=node_id).select_related("batch").order_by("batch__seq", "pk")
        return [{"kind": r.kind, "ts": r.ts, "data": r.data, "seq": r.batch.seq} for r in rows]

    def telemetry_batches(self, node_id: int) -> list[dict]:
        return [{"seq": b.seq, "dropped": b.dropped, "count": b.record_count}
                for b in TelemetryBatch.objects.filter(node_id=node_id).order_by("seq")]

    def dropped(self, node_id: int) -> int:
        return Node.objects.get(pk=node_id).telemetry_dropped

    def heartbeats(self, node_id: int) -> list[dict]:
        node = Node.objects.get(pk=node_id)
        return [node.agent_status] if node.last_seen and node.agent_status else []

    def inventory(self, node_id: int) -> dict | None:
        return Node.objects.get(pk=node_id).inventory or None

    # -- not available on the real console ----------------------------------------------------

    def requests(self, path_regex: str = ".*"):
        raise NotImplementedError("the real console does not record requests; use the fake console")

    def inject(self, path_regex: str, mode, times: int = 1):
        raise NotImplementedError("the real console has no fault injection; use the fake console")

    def clear_faults(self) -> None:
        pass
