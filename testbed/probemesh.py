"""The probe mesh on an emulated fabric: plans for its hosts, and the mesh run in every host.

    plans = mesh_plans(fab)                        # every NIC probes every other NIC
    with MeshRun(fab, plans) as run:               # `python -m agent.probemesh run` in each host
        run.wait_windows(3)
        records = run.records()                    # probe.window data, all hosts
    obs = observations(records_of_one_window)      # workers.probemesh: lockstep.observations/v1

The plan's ``routers`` is the fabric's interface address table (`Fabric.router_addresses`), so
discovered paths come out as link ids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .fabric import Fabric

REPO = Path(__file__).resolve().parent.parent


def mesh_plans(fab: Fabric, peers: dict[str, list[str]] | None = None, **options) -> dict[str, dict]:
    """The probe.mesh plan of each host: its NICs with their peers (default: every other NIC of
    the fabric), the fabric's router addresses, and `options` (plan arguments)."""
    nics = fab.nics
    if peers is None:
        peers = {n: [m for m in nics if m != n] for n in nics}
    routers = fab.router_addresses()
    out: dict[str, dict] = {}
    for host in fab.hosts:
        plan = {"nics": [{"name": n, "interface": fab.nic_ifname(n), "address": fab.nic_address(n),
                          "peers": [[m, fab.nic_address(m)] for m in peers.get(n, [])]}
                         for n in fab.host_nics(host)],
                "routers": routers}
        plan.update(options)
        out[host] = plan
    return out


class MeshRun:
    """`python -m agent.probemesh run` in every host of `plans`; records collected as they come."""

    def __init__(self, fab: Fabric, plans: dict[str, dict], *, engine: str | None = None,
                 synced_clock: bool = True, env: dict | None = None):
        self.fab = fab
        self.plans = plans
        self.engine = engine
        self.synced_clock = synced_clock
        self.env = env
        self._dir = tempfile.TemporaryDirectory(prefix="probemesh-")
        self.procs: dict[str, subprocess.Popen] = {}
        self.status: dict[str, dict] = {}
        self.routes: dict[str, list[dict]] = {}  # at stop: each host's learned paths
        self._records: list[tuple[float, str, dict]] = []
        self._stderr: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> MeshRun:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        for host, plan in self.plans.items():
            path = Path(self._dir.name) / f"{host.replace('/', '_')}.json"
            path.write_text(json.dumps(plan))
            argv = [sys.executable, "-m", "agent.probemesh", "run", str(path)]
            if self.engine:
                argv += ["--engine", self.engine]
            if self.synced_clock:
                argv.append("--synced-clock")
            argv.append("--routes")
            proc = self.fab.spawn(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO),
                                  env=(self.env or os.environ) | {"PYTHONPATH": str(REPO)})
            self.procs[host] = proc
            for stream, fn in ((proc.stdout, self._read_out), (proc.stderr, self._read_err)):
                t = threading.Thread(target=fn, args=(host, stream), daemon=True)
                t.start()
                self._threads.append(t)

    def _read_out(self, host: str, stream) -> None:
        for line in stream:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                if "status" in msg:
                    self.status[host] = msg["status"]
                elif "routes" in msg:
                    self.routes[host] = msg["routes"]
                elif msg.get("kind") == "probe.window":
                    self._records.append((time.time(), host, msg["data"]))

    def _read_err(self, host: str, stream) -> None:
        for line in stream:
            with self._lock:
                self._stderr.setdefault(host, []).append(line.decode(errors="replace").rstrip())

    def records(self, since: float = 0.0) -> list[dict]:
        """probe.window data received after `since` (time.time()), in arrival order."""
        with self._lock:
            return [r for t, _h, r in self._records if t >= since]

    def arrivals(self) -> list[tuple[float, str, dict]]:
        with self._lock:
            return list(self._records)

    def windows(self, since: float = 0.0) -> dict[int, list[dict]]:
        """Records by window start, for windows every NIC has reported (complete)."""
        nics = {n["name"] for plan in self.plans.values() for n in plan["nics"]}
        by: dict[int, list[dict]] = {}
        for r in self.records(since):
            by.setdefault(r["start_ns"], []).append(r)
        return {w: rs for w, rs in sorted(by.items()) if {r["nic"] for r in rs} >= nics}

    def wait_windows(self, count: int, since: float = 0.0, timeout: float = 60.0,
                     condition: Callable[[dict[int, list[dict]]], bool] | None = None) -> dict[int, list[dict]]:
        """Wait until `count` complete windows started after `since` (and `condition` holds)."""
        deadline = time.monotonic() + timeout
        start_ns = int(since * 1e9)
        while True:
            done = {w: rs for w, rs in self.windows().items() if w >= start_ns}
            if len(done) >= count and (condition is None or condition(done)):
                return done
            for host, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"the probe mesh in {host} exited ({proc.returncode}): "
                                       f"{' | '.join(self._stderr.get(host, [])[-5:])}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(done)} of {count} complete windows after {timeout} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for t in self._threads:
            t.join(timeout=5)
        self._dir.cleanup()


def records_by_host(topology: dict, observations: dict, start_ns: int, window_s: float = 1.0) -> dict[str, list[dict]]:
    """The probe.window records (lockstep.probe.window/v1) agents would post for a simulated
    window (`lockstep.observations/v1`), by host: each probe is an entry of its source NIC's record."""
    host_of = {n["name"]: n["host"] for n in topology["nics"]}
    by_nic: dict[str, list[dict]] = {n: [] for n in host_of}
    for p in observations["probes"]:
        entry = {"src": p["src"], "dst": p["dst"], "via": "probe", "sent": p["sent"], "lost": p["lost"]}
        if "owd_us" in p:
            entry["owd_us"], entry["owd_basis"] = p["owd_us"], p.get("owd_basis", "clock")
        if "path" in p:
            entry["path"] = p["path"]
        by_nic[p["src"]].append(entry)
    out: dict[str, list[dict]] = {}
    for nic, probes in by_nic.items():
        out.setdefault(host_of[nic], []).append({
            "format": "lockstep.probe.window/v1", "nic": nic, "start_ns": start_ns, "window_s": window_s,
            "clock": "cluster", "probes": probes, "received": []})
    return out
