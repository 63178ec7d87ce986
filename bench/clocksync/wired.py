"""The wired system on the emulated fabric: real agents, the console, the cluster time nodes serve.

    sudo .venv/bin/python -m bench.clocksync wired [--hosts 6] [--duration 120] [--json out.json]

1. An emulated fabric (``testbed.Fabric``, two leaves and a spine, one NIC per host); every host
   a random virtual clock (offset ±50 ms, drift ±50 ppm: the agent's test-only variables).
2. The console on embedded defaults (``manage.py serve``: SQLite, the solve in-process) in a
   temporary directory; one real agent per host; clock sync started through the API.
3. Every second, each agent's local socket ``time``: the offset it serves against the truth at
   the instant it read its clock (its answer's cluster time + offset: no socket latency). Reported: for every host pair, the error of the synchronized time between them
   ((served_i − served_j) − (true_i − true_j)), p50 and p99 after the first ``--settle`` s; the
   time from the start until every node serves ``synced`` within 1 µs of the truth; the console's
   own stated bounds; the agents' CPU (whole agent processes: probing, estimation, everything).

Unlike ``fabric`` (the prober and the solve run by the benchmark), this measures what a process
on a node gets: estimates travel as telemetry, corrections come back as commands every
``LOCKSTEP_CLOCK_CORRECT_EVERY_S``, and the agent extrapolates with its drift in between.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agent.clocksync.clock import ClockSource
from agent.localsock.client import AgentSocket
from testbed import Fabric, generate
from testbed.testing import unique_prefix

REPO = Path(__file__).resolve().parents[2]
CONVERGED_NS = 1000.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _real_instant(source: ClockSource, local_ns: int) -> int:
    real = local_ns - source.offset_ns
    for _ in range(3):
        real = local_ns - (source.transform(real) - real)
    return real


def _pct(values, q) -> float:
    return float(np.percentile(np.abs(values), q)) if len(values) else float("nan")


def _console_env(out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(SQLITE_PATH=str(out / "console.sqlite3"), LOCKSTEP_VAR_DIR=str(out / "var"), LOCKSTEP_HTTPS="0",
               PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="console.settings",
               DEBUG=os.environ.get("DEBUG", "true"))  # a throwaway console: its dev secret key
    return env


def _seed(out: Path, topology: dict) -> tuple[int, str, str]:
    """Migrate the console's database and create an organization, its cluster and tokens (in this process)."""
    os.environ.update(_console_env(out))
    for key in ("DATABASE_URL", "REDIS_URL"):
        os.environ.pop(key, None)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from console.core import scoping
    from console.fleet import services as fleet
    from console.tenancy import services as tenancy
    from console.tenancy.models import TokenScope

    call_command("migrate", verbosity=0)
    with scoping.unscoped("the benchmark seeds its console"):
        owner = get_user_model().objects.create_user("bench", password=os.urandom(16).hex())
        org = tenancy.create_organization("Bench", owner, slug="bench")
    with scoping.for_organization(org.pk):
        cluster = fleet.create_cluster(org.pk, "bench-cluster", "")
        fleet.import_topology(cluster, topology)
        enroll = fleet.mint_enrollment_token(cluster, description="bench agents", max_uses=None).plaintext
        api = tenancy.mint_api_token(org.pk, owner, name="bench", scope=TokenScope.WRITE).plaintext
    return cluster.pk, enroll, api


def main(args) -> int:
    import requests

    if os.geteuid() != 0:
        print("the wired benchmark needs root (network namespaces)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    out = Path(args.out or tempfile.mkdtemp(prefix="lockstep-clockwired-"))
    out.mkdir(parents=True, exist_ok=True)
    n = args.hosts
    topology = generate(hosts=n, rails=1, hosts_per_leaf=math.ceil(n / 2), spines=1, name="bench-clock")
    cluster_id, enroll, api_token = _seed(out, topology)
    load_before = os.getloadavg()
    fab = Fabric.up(topology, prefix=unique_prefix(), base_dir=out / "testbed")
    server = None
    try:
        port = _free_port()
        env = _console_env(out)
        env["LOCKSTEP_CLOCK_CORRECT_EVERY_S"] = str(args.correct_every)
        server = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port), "--also-listen",
                                   fab.bridge_address], cwd=REPO, env=env, stdout=open(out / "serve.log", "w"),  # noqa: SIM115
                                  stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {api_token}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{base}/healthz", timeout=1).ok:
                    break
            time.sleep(0.2)
        hosts = sorted(fab.plan.hosts)
        ref = hosts[0]
        epoch = time.time_ns()
        clocks = {h: ClockSource(int(rng.uniform(-50e6, 50e6)), float(rng.uniform(-50, 50)), epoch) for h in hosts}
        for h in hosts:
            c = clocks[h]
            fab.start_agents(console_url=fab.console_url(port), token=enroll, cluster_id=cluster_id, hosts=[h],
                             env={"LOCKSTEP_TEST_CLOCK_OFFSET_NS": str(c.offset_ns),
                                  "LOCKSTEP_TEST_CLOCK_DRIFT_PPM": repr(c.drift_ppm),
                                  "LOCKSTEP_TEST_CLOCK_EPOCH_NS": str(epoch)})
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            nodes = api.get(f"{base}/api/v1/nodes/", params={"cluster": cluster_id}, timeout=10).json()["results"]
            nics = api.get(f"{base}/api/v1/nics/", params={"cluster": cluster_id, "limit": 1000}, timeout=10).json()
            if sorted(x["name"] for x in nodes if x["state"] == "ready") == hosts and \
                    sum(1 for x in nics["results"] if x.get("addresses")) >= n:
                break
            time.sleep(1)
        started = api.post(f"{base}/api/v1/clock-syncs/", json={"cluster": cluster_id, "peers": args.peers}, timeout=30)
        started.raise_for_status()
        t_start = time.monotonic()
        print(f"fabric {fab.prefix}: {n} hosts, clock sync started; output {out}", flush=True)
        cpu0 = {h: _cpu_of(fab.agents()[h]["pid"]) for h in hosts}
        sockets = {h: AgentSocket(str(fab.agents()[h]["state_dir"]) + "/agent.sock") for h in hosts}
        samples: list[dict] = []
        converged_at = None
        while (elapsed := time.monotonic() - t_start) < args.duration:
            row: dict = {"t": elapsed, "err": {}, "synced": {}}
            for h in hosts:
                answer = sockets[h].time(timeout=2)
                if not answer:
                    continue
                # the instant the agent read its clock (cluster time + offset is its local reading)
                real = _real_instant(clocks[h], int(answer["cluster_time_ns"]) + round(answer["offset_ns"]))
                truth = clocks[h].transform(real) - clocks[ref].transform(real)
                row["err"][h] = float(answer["offset_ns"]) - truth
                row["synced"][h] = bool(answer["synced"])
            samples.append(row)
            if converged_at is None and len(row["synced"]) == n and all(row["synced"].values()) and \
                    all(abs(e) < CONVERGED_NS for e in row["err"].values()):
                converged_at = elapsed
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t_start - elapsed)))
        cpu = {h: (_cpu_of(fab.agents()[h]["pid"]) - cpu0[h]) / args.duration for h in hosts}
        shown = api.get(f"{base}/api/v1/node-clocks/", params={"cluster": cluster_id}, timeout=10).json()["results"]
        quality = api.get(f"{base}/api/v1/clock-syncs/", params={"cluster": cluster_id}, timeout=10).json()["results"][0]
        settled = [s for s in samples if s["t"] >= args.settle and len(s["err"]) == n and all(s["synced"].values())]
        pairs = [s["err"][a] - s["err"][b] for s in settled for i, a in enumerate(hosts) for b in hosts[i + 1:]]
        to_ref = [s["err"][h] for s in settled for h in hosts if h != ref]
        result = {
            "hosts": n, "duration_s": args.duration, "settle_s": args.settle, "samples": len(settled),
            "pair_error_p50_ns": _pct(pairs, 50), "pair_error_p99_ns": _pct(pairs, 99),
            "pair_error_max_ns": _pct(pairs, 100), "to_reference_p99_ns": _pct(to_ref, 99),
            "converged_within_1us_s": converged_at,
            "console_bound_ns": {r["node_name"]: r["bound_ns"] for r in shown},
            "console_sigma_ns": {r["node_name"]: r["sigma_ns"] for r in shown},
            "console_worst_bound_ns": quality["worst_bound_ns"], "flagged_pairs": len(quality["flagged"]),
            "agent_cpu_cores_mean": float(np.mean(list(cpu.values()))), "correct_every_s": args.correct_every,
            "load_before": load_before, "load_after": os.getloadavg(), "output": str(out),
        }
        (out / "samples.json").write_text(json.dumps(samples))
        print(json.dumps(result, indent=1, default=float))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=float))
        return 0
    finally:
        fab.stop_agents()
        fab.down()
        if server is not None and server.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, 15)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(15)
