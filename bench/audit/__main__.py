"""`python -m bench.audit`: a full fleet audit of an emulated cluster, through the real console.

    python -m bench.audit --hosts 16 --rails 2 --inject "link-police node0001/nic1~leaf-su00-r1 --mbit 4" \\
        --inject "node-gpu node0003 --defect remap-pending --gpu 2" --json out.json
    python -m bench.audit --hosts 16 --rails 2 --trials 20 --json trials.json   # randomized defect sets

Brings up the fabric (``testbed.Fabric``: namespaces, leaf-spine, 8 hosts per leaf, 2 spines), a
console (``manage.py serve`` on a fresh SQLite database in a temporary directory; periodic tasks
in-process) and a real agent per host with the NVML fake (8 H100s each), enrolled in it; injects
each ``--inject`` (the arguments of ``python -m testbed fault``, names as in the generated
topology); runs a full audit through the REST API (node checks ``gpu``, then every
link loaded at once and localized); writes the findings as a ``lockstep.verdict/v1`` document with
the timings and the ground truth to ``--json``; tears everything down.

``--trials K``: K audits, each with a fresh random set of 0-2 defects from the kinds below (heals
between trials; kinds: a policed, rate-limited or one-way lossy NIC cable, a wrong MTU, a
GPU defect, a leaf with ECMP off), scored against the ground truth: precision and recall of the culprits (by kind
and name) and false culprits on the healthy trials.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {"sections": ["gpu"], "listen_ms": 10, "load_duration_s": 4.0, "rate_mbit": 2.0,
           "flows_per_nic": 8, "node_timeout_s": 120}
# the NVML fake's defects the gpu section fails on (pcie-gen4-x8 needs the pcie section's PCI tree;
# persistence-off is a warning, not a culprit)
GPU_DEFECTS = ("ecc", "remap-pending", "remap-failure", "xid", "throttle-thermal", "power-brake", "nvlink-down",
               "fabric-not-started", "power-capped", "lost")


def _setup_django(db_path: Path) -> None:
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    os.environ["SQLITE_PATH"] = str(db_path)
    os.environ["LOCKSTEP_VAR_DIR"] = str(db_path.parent)  # the console's secret key lives there: the same for both
    os.environ.setdefault("DEBUG", "true")  # a throwaway console: its dev secret key in that var dir, as the demo
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def _seed(topology: dict) -> tuple[int, str, str]:
    """(cluster id, enrollment token, API token) of a fresh organization."""
    from django.contrib.auth import get_user_model

    from console.core import scoping
    from console.fleet import services as fleet
    from console.tenancy import services as tenancy
    from console.tenancy.models import TokenScope

    user = get_user_model().objects.create_user("bench", password="bench-audit")  # noqa: S106  (throwaway DB)
    organization = tenancy.create_organization("Bench", user, slug="bench")
    with scoping.for_organization(organization.pk):
        cluster = fleet.create_cluster(organization.pk, "bench-cluster")
        fleet.import_topology(cluster, topology)
        enrollment = fleet.mint_enrollment_token(cluster, max_uses=None).plaintext
        api = tenancy.mint_api_token(organization.pk, user, name="bench", scope=TokenScope.WRITE).plaintext
    return cluster.pk, enrollment, api


def _ready(cluster_id: int, hosts: int, nics: int) -> bool:
    from console.core import scoping
    from console.fleet.models import Nic, Node, NodeState

    with scoping.unscoped("the benchmark waits for its own agents"):
        return (Node.objects.filter(cluster_id=cluster_id, state=NodeState.READY).count() == hosts
                and Nic.objects.filter(cluster_id=cluster_id, in_topology=True).exclude(addresses=[]).count() == nics)


def _wait(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _inject(fab, spec: str) -> None:
    argv = [sys.executable, "-m", "testbed", "--prefix", fab.prefix, "--state-dir", str(fab.state_dir.parent), "fault",
            *shlex.split(spec)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"--inject {spec!r}: {proc.stderr.strip() or proc.stdout.strip()}")


def _audit(api: requests.Session, base: str, cluster_id: int, options: dict,
           timeout: float) -> tuple[dict, dict, float]:
    t0 = time.monotonic()
    response = api.post(f"{base}/api/v1/clusters/{cluster_id}/audits/", json={"options": options}, timeout=60)
    response.raise_for_status()
    run_id = response.json()["id"]
    def finished():
        answer = api.get(f"{base}/api/v1/audits/{run_id}/", timeout=30)
        # SQLite under this load answers "database is locked" now and then: ask again
        return answer.ok and answer.json()["state"] != "running" and answer.json()

    run = _wait(finished, timeout, f"audit {run_id}")
    wall = time.monotonic() - t0
    return run, api.get(f"{base}/api/v1/audits/{run_id}/report/", timeout=30).json(), wall


def _random_defects(rng: random.Random, fab) -> list[str]:
    """0-2 defects on distinct hosts, as `python -m testbed fault` arguments."""
    hosts = rng.sample(fab.hosts, 2)
    out = []
    for host in hosts[:rng.choice((0, 1, 1, 2))]:
        nic = rng.choice([n for n in fab.nics if n.startswith(host + "/")])
        link = next(lid for lid in fab.links if lid.startswith(nic + "~"))
        kind = rng.choice(("link-police", "nic-mtu", "node-gpu", "link-rate", "link-loss", "switch-ecmp-off"))
        if kind == "switch-ecmp-off":  # the leaf this host's NIC is cabled to
            out.append(f"switch-ecmp-off {link.split('~', 1)[1]}")
        elif kind == "link-police":
            out.append(f"link-police {link} --mbit 4 --direction 'a>b'")
        elif kind == "link-rate":
            out.append(f"link-rate {link} --mbit 4")
        elif kind == "link-loss":
            out.append(f"link-loss {link} --rate 0.1 --direction 'a>b'")
        elif kind == "nic-mtu":
            out.append(f"nic-mtu {nic} --mtu 1200")
        else:
            out.append(f"node-gpu {host} --defect {rng.choice(GPU_DEFECTS)} --gpu {rng.randrange(8)}")
    return out


def _key(c: dict) -> tuple[str, str]:
    return c["kind"], c["name"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.audit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--rails", type=int, default=2)
    parser.add_argument("--inject", action="append", default=[], metavar="FAULT ARGS",
                        help="a `python -m testbed fault` command line, quoted (repeatable)")
    parser.add_argument("--trials", type=int, default=0, help="randomized defect sets instead of --inject")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600, help="longest one audit may take (s)")
    parser.add_argument("--prefix", default=f"ba{os.getpid() % 100000}")
    parser.add_argument("--json", metavar="OUT", help="write the result here")
    args = parser.parse_args(argv)
    # a SIGTERM (a timeout) unwinds like Ctrl-C, so the fabric, the agents and the console go down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from testbed import Fabric, generate, nvmlshim
    from testbed.consolestack import ConsoleStack

    work = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    _setup_django(work / "console.sqlite3")
    topology = generate(hosts=args.hosts, rails=args.rails, hosts_per_leaf=8, spines=2)
    cluster_id, enrollment, api_token = _seed(topology)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {"SQLITE_PATH": str(work / "console.sqlite3"), "LOCKSTEP_AUDIT_TICK_S": "1", "LOCKSTEP_VAR_DIR": str(work)}
    t_up = time.monotonic()
    fab = Fabric.up(topology, prefix=args.prefix, base_dir=work / "testbed")
    out: dict = {"format": "lockstep.bench.audit/v1", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "machine": {"node": platform.node(), "cpus": os.cpu_count(), "load": os.getloadavg(),
                             "python": platform.python_version()},
                 "hosts": args.hosts, "rails": args.rails,
                 # the console plans the load's lead and length from the hosts and the delivery it sees
                 "options": OPTIONS}
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {api_token}"
    try:
        with ConsoleStack(fab, env, work / "logs") as stack:
            fab.start_agents(console_url=stack.agent_url, token=enrollment, cluster_id=cluster_id,
                             env=nvmlshim.agent_env("hgx_h100") | {"LOCKSTEP_INVENTORY_INTERVAL_S": "5"})
            _wait(lambda: _ready(cluster_id, args.hosts, args.hosts * args.rails), 300, "every agent ready")
            out["setup_s"] = round(time.monotonic() - t_up, 1)
            rng = random.Random(args.seed)
            sets = [args.inject] if not args.trials else [_random_defects(rng, fab) for _ in range(args.trials)]
            trials = []
            for injected in sets:
                for spec in injected:
                    _inject(fab, spec)
                truth = [c for c in fab.ground_truth()["culprits"]]
                run, report, wall = _audit(api, stack.url, cluster_id, out["options"], args.timeout)
                found = report.get("verdict") or {"format": "lockstep.verdict/v1", "network_ok": True, "culprits": []}
                t, f = {_key(c) for c in truth}, {_key(c) for c in found["culprits"]}
                load = (report.get("plan") or {}).get("load") or {}
                trials.append({"injected": injected, "truth": truth, "verdict": found, "status": run["verdict"],
                               "load": {k: load.get(k) for k in ("lead_s", "duration_s", "late_allowance_s")},
                               "started_late_s": (report.get("fabric") or {}).get("started_late_s"),
                               "not_measured": len((report.get("fabric") or {}).get("missing") or []),
                               "wall_s": round(wall, 1), "true_culprits": len(t & f), "false_culprits": sorted(f - t),
                               "missed": sorted(t - f), "not_audited": report.get("not_audited", [])})
                print(f"audit {run['id']}: {run['verdict']} in {wall:.1f} s; injected {injected}; "
                      f"found {sorted(f)}; missed {sorted(t - f)}; false {sorted(f - t)}", flush=True)
                fab.heal_all()
            fab.stop_agents()
    finally:
        fab.down()
    shutil.rmtree(work, ignore_errors=True)  # kept when a run fails: its console and agent logs
    tp = sum(t["true_culprits"] for t in trials)
    fp = sum(len(t["false_culprits"]) for t in trials)
    fn = sum(len(t["missed"]) for t in trials)
    out |= {"trials": trials, "wall_s": [t["wall_s"] for t in trials],
            "precision": tp / (tp + fp) if tp + fp else 1.0, "recall": tp / (tp + fn) if tp + fn else 1.0,
            "false_culprits_on_healthy": sum(len(t["false_culprits"]) for t in trials if not t["truth"]),
            "healthy_trials": sum(not t["truth"] for t in trials)}
    if not args.trials:
        out["verdict"] = trials[0]["verdict"]
    print(json.dumps({k: out[k] for k in ("hosts", "rails", "setup_s", "wall_s", "precision", "recall",
                                          "false_culprits_on_healthy", "healthy_trials")}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
