"""Ingest: probe windows per second one console process and one worker sustain, pipelined.

A cluster of the `gpu1024` preset (128 hosts x 8 rails, 1,024 NICs) with every host an enrolled
node; each window is simulated by `testbed.simulate` (46 peers per NIC: the probe plan's size at
1,024 GPUs; a link fault in every other window), turned into the 1,024 `probe.window` records
the agents would post (one per NIC, one batch per host) and stored by this process, the console,
through the telemetry service the agent endpoint calls (`console.telemetry.services.ingest`),
whose handler files them into the cluster window; the window's triangulation task runs in a
Celery worker (`celery worker --pool solo`, one process) started by the bench when REDIS_URL is
set, as deployed: the worker triangulates window N while the console stores N+1.

Windows are offered at `rate` per second (window i is due at i / rate; 0: back to back, as fast
as the console stores them) after one warm-up window (the caches of both processes). Measured:
each window's store (wall and this process's CPU), when its verdict was written (the window's
`triangulated_at`), the worker's CPU (/proc/PID/stat) over the measured windows. Sustained
throughput is the measured windows over the time from the first one's offer to the last one's
verdict; the pipeline keeps up at `rate` when every store ends before the next window is due and
the verdicts' lag behind the offers does not grow (`lag_growth_s`: the last third's mean lag
minus the first third's). Without REDIS_URL the task runs eagerly in this process (the embedded
defaults): no pipeline, one process doing both in turn, said so in the result. Goal (issue 10):
a 1,024-GPU cluster's windows every second.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TICK_S = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK_S


def _start_worker(log_path: Path) -> subprocess.Popen:
    from console.celery import app

    app.control.purge()  # tasks a killed run left in this Redis db
    out = open(log_path, "wb")  # noqa: SIM115  (closed with the process)
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "console", "worker", "--pool", "solo",
                             "--concurrency", "1", "--without-heartbeat", "--without-gossip", "--without-mingle",
                             "--loglevel", "warning"], cwd=ROOT, env=dict(os.environ), stdout=out,
                            stderr=subprocess.STDOUT)


def _wait_settled(cluster, starts: list[int], timeout_s: float, worker: subprocess.Popen | None,
                  log_path: Path | None) -> dict[int, object]:
    """start_ns -> ProbeWindow once every window of `starts` has its verdict (or failed)."""
    from console.incidents.models import ProbeWindow

    deadline = time.monotonic() + timeout_s
    while True:
        windows = {w.start_ns: w for w in ProbeWindow.objects.filter(cluster=cluster, start_ns__in=starts)}
        if len(windows) == len(starts) and all(w.triangulated_at is not None for w in windows.values()):
            return windows
        if worker is not None and worker.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path else ""
            raise RuntimeError(f"the Celery worker exited ({worker.returncode}):\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{sum(w.triangulated_at is not None for w in windows.values())} of {len(starts)} "
                               f"windows triangulated within {timeout_s:.0f} s")
        time.sleep(0.05)


def run(windows: int = 20, preset: str = "gpu1024", peers: int = 46, rate: float = 1.0, *, tmp: Path,
        log=print) -> dict:
    from django.utils import timezone

    from console.celery import app
    from console.core import scoping
    from console.fleet.models import Cluster
    from console.fleet.services import enroll, import_topology, mark_seen, mint_enrollment_token
    from console.incidents.models import Incident
    from console.incidents.services import fabric_model
    from console.telemetry.services import ingest
    from console.tenancy.models import Organization
    from testbed.probemesh import records_by_host
    from testbed.simulate.topology import PRESETS, generate_topology
    from testbed.simulate.window import WindowConfig, simulate

    load_start = round(os.getloadavg()[0], 2)
    pipelined = bool(os.environ.get("REDIS_URL"))
    app.conf.task_always_eager = not pipelined
    params, _ = PRESETS[preset]
    topology = generate_topology(params, name=f"bench-{preset}")
    worker, worker_log = None, tmp / "worker.log"
    with scoping.unscoped("the benchmark arranges its own organization"):
        org = Organization.objects.create(name=f"bench {time.time_ns()}", slug=f"bench-{time.time_ns()}")
        cluster = Cluster.objects.create(organization=org, name="bench")
        try:
            import_topology(cluster, topology)
            token = mint_enrollment_token(cluster, max_uses=None).plaintext
            nodes = {}
            for host in (h["name"] for h in topology["hosts"]):
                enrolled = enroll(token, {"hostname": host, "machine_id": f"{org.slug}-{host}"})
                nodes[host] = mark_seen(enrolled.node)
            t = time.perf_counter()
            fabric_model(cluster)
            model_s = time.perf_counter() - t
            log(f"  {len(nodes)} hosts, {len(topology['nics'])} NICs; FabricModel built in {model_s:.2f} s")
            scenarios = [simulate(topology, WindowConfig(faults="link_loss:1" if i % 2 else "none", seed=7,
                                                         peers_per_nic=peers, sent=100, window_s=1.0,
                                                         noisy_hosts=0))
                         for i in range(2)]
            start0 = int(timezone.now().timestamp()) * 10**9
            starts = [start0 + i * 10**9 for i in range(windows + 1)]  # [0] is the warm-up window
            batches = [records_by_host(topology, scenarios[i % 2].observations, s) for i, s in enumerate(starts)]
            rows = sum(len(r["probes"]) for rs in batches[0].values() for r in rs)
            seqs = dict.fromkeys(nodes, 0)

            def store(i: int) -> tuple[float, float]:
                t0, c0 = time.perf_counter(), time.process_time()
                with scoping.for_organization(org.pk):
                    for host, records in batches[i].items():
                        seqs[host] += 1
                        ingest(nodes[host], {"seq": seqs[host], "records": [
                            {"kind": "probe.window", "ts": starts[i] / 1e9 + 1.01, "data": r} for r in records]},
                            5000)
                return time.perf_counter() - t0, time.process_time() - c0

            if pipelined:
                worker = _start_worker(worker_log)
            store(0)
            _wait_settled(cluster, starts[:1], 180, worker, worker_log)  # warm-up: the worker's model too
            log(f"  warm-up window triangulated ({'a Celery worker' if pipelined else 'in this process'})")
            worker_cpu0 = _cpu_s(worker.pid) if worker else 0.0
            store_s, store_cpu, offered, stored = [], [], [], []
            t_first = time.time()
            for i in range(1, windows + 1):
                due = t_first + (i - 1) / rate if rate > 0 else time.time()
                time.sleep(max(0.0, due - time.time()))
                offered.append(due)  # when its agents post it: a console behind adds to the lag
                wall, cpu = store(i)
                store_s.append(wall)
                store_cpu.append(cpu)
                stored.append(time.time())
            settled = _wait_settled(cluster, starts[1:], 60 + 10 * windows, worker, worker_log)
            worker_cpu = (_cpu_s(worker.pid) - worker_cpu0) if worker else 0.0
            verdict_at = [settled[s].triangulated_at.timestamp() for s in starts[1:]]
            elapsed = max(verdict_at) - offered[0]
            lag = [v - o for v, o in zip(verdict_at, offered, strict=True)]
            third = max(1, windows // 3)
            lag_growth = statistics.mean(lag[-third:]) - statistics.mean(lag[:third])
            kept_pace = None if rate <= 0 else all(stored[k] <= offered[0] + (k + 1) / rate for k in range(windows - 1))
            for i, w in enumerate(settled[s] for s in starts[1:]):
                log(f"  window {i + 1}: {w.state}, {w.reported}/{w.expected} NICs, store {store_s[i]:.2f} s "
                    f"({store_cpu[i]:.2f} s CPU), verdict {lag[i]:.2f} s after its offer, culprits "
                    f"{[c['name'] for c in (w.verdict or {}).get('culprits', [])]}")
            states = statistics.multimode(w.state for w in settled.values())
            result = {
                "preset": preset, "hosts": len(nodes), "nics": len(topology["nics"]), "peers_per_nic": peers,
                "pair_rows_per_window": rows, "fabric_model_s": round(model_s, 3),
                "mode": "console + Celery worker (pipelined)" if pipelined else "one process (eager task)",
                "rate_offered": rate, "windows": windows,
                "windows_per_s": round(windows / elapsed, 3),
                "kept_up": None if rate <= 0 else bool(kept_pace and lag_growth < 0.5),
                "store_kept_pace": kept_pace, "lag_growth_s": round(lag_growth, 3),
                "lag_s_median": round(statistics.median(lag), 3), "lag_s_max": round(max(lag), 3),
                "store_s_median": round(statistics.median(store_s), 3),
                "console_cpu_s_per_window": round(sum(store_cpu) / windows, 3),
                "worker_cpu_s_per_window": round(worker_cpu / windows, 3) if worker else None,
                "store_s": [round(x, 3) for x in store_s], "lag_s": [round(x, 3) for x in lag],
                "states": states, "complete": all(w.reported == w.expected for w in settled.values()),
                "incidents": Incident.objects.filter(cluster=cluster).count(),
                "load1_start": load_start, "load1_end": round(os.getloadavg()[0], 2),
            }
        finally:
            if worker is not None:
                worker.terminate()
                try:
                    worker.wait(30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
            Cluster.objects.filter(pk=cluster.pk).delete()
            org.delete()
    return result
