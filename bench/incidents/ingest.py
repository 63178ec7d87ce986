"""Ingest: probe windows per second one console process stores and triangulates.

A cluster of the `gpu1024` preset (128 hosts x 8 rails, 1,024 NICs) with every host an enrolled
node; each window is simulated by `testbed.simulate` (46 peers per NIC: the probe plan's size at
1,024 GPUs; a link fault in every other window), turned into the 1,024 `probe.window` records
the agents would post (one per NIC, one batch per host) and stored through the telemetry service
the agent endpoint calls (`console.telemetry.services.ingest`), whose handler files them into the
cluster window; the window's triangulation task runs in the same process (eager, as on embedded
defaults): one process does the console's and the worker's work, one after the other.

Measured per window, wall clock and this process's CPU time: storing the 128 batches (each
record checked, stored and filed into its window in the batch's one transaction), and the
triangulation task (the window's records read back by its key, merged into arrays, verdict,
incidents). `windows_per_s` is one process doing both, one after the other (1 / (store +
triangulate)); `windows_per_s_two_processes` is the console process and the worker each doing
its part at once on the two cores (1 / max(store, triangulate)), what the deployment runs. Goal
(issue 10): a 1,024-GPU cluster's windows every second.
"""

from __future__ import annotations

import statistics
import time


def run(windows: int = 6, preset: str = "gpu1024", peers: int = 46, log=print) -> dict:
    from django.utils import timezone

    from console.celery import app
    from console.core import scoping
    from console.fleet.models import Cluster
    from console.fleet.services import enroll, import_topology, mark_seen, mint_enrollment_token
    from console.incidents.models import Incident, ProbeWindow
    from console.incidents.services import fabric_model
    from console.telemetry.services import ingest
    from console.tenancy.models import Organization
    from testbed.probemesh import records_by_host
    from testbed.simulate.topology import PRESETS, generate_topology
    from testbed.simulate.window import WindowConfig, simulate

    app.conf.task_always_eager = True
    params, _ = PRESETS[preset]
    topology = generate_topology(params, name=f"bench-{preset}")
    with scoping.unscoped("the benchmark arranges its own organization"):
        org = Organization.objects.create(name=f"bench {time.time_ns()}", slug=f"bench-{time.time_ns()}")
        cluster = Cluster.objects.create(organization=org, name="bench")
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
                                                     peers_per_nic=peers, sent=100, window_s=1.0, noisy_hosts=0))
                     for i in range(2)]
        start0 = int(timezone.now().timestamp()) * 10**9
        seqs = dict.fromkeys(nodes, 0)
        store, tri, rows, store_cpu, tri_cpu = [], [], [], [], []
        import console.incidents.services as services

        original = services.triangulate_window
        timing = {}

        def timed(window_id):
            t0, c0 = time.perf_counter(), time.process_time()
            out = original(window_id)
            timing["tri"], timing["tri_cpu"] = time.perf_counter() - t0, time.process_time() - c0
            return out

        services.triangulate_window = timed
        try:
            for i in range(windows):
                obs = scenarios[i % 2].observations
                start_ns = start0 + i * 10**9
                by_host = records_by_host(topology, obs, start_ns)
                timing.clear()
                t0, c0 = time.perf_counter(), time.process_time()
                with scoping.for_organization(org.pk):
                    for host, records in by_host.items():
                        seqs[host] += 1
                        ingest(nodes[host], {"seq": seqs[host], "records": [
                            {"kind": "probe.window", "ts": start_ns / 1e9 + 1.01, "data": r} for r in records]}, 5000)
                total, total_cpu = time.perf_counter() - t0, time.process_time() - c0
                tri.append(timing.get("tri", 0.0))
                tri_cpu.append(timing.get("tri_cpu", 0.0))
                store.append(total - tri[-1])
                store_cpu.append(total_cpu - tri_cpu[-1])
                rows.append(sum(len(r["probes"]) for rs in by_host.values() for r in rs))
                window = ProbeWindow.objects.get(cluster=cluster, start_ns=start_ns)
                log(f"  window {i}: {window.state}, {window.reported}/{window.expected} NICs, {rows[-1]} pair rows, "
                    f"store {store[-1]:.2f} s ({store_cpu[-1]:.2f} s CPU), triangulate {tri[-1]:.2f} s "
                    f"({tri_cpu[-1]:.2f} s CPU), culprits "
                    f"{[c['name'] for c in window.verdict.get('culprits', [])]}")
        finally:
            services.triangulate_window = original
        incidents = Incident.objects.filter(cluster=cluster).count()
        per_window = [s + t for s, t in zip(store, tri, strict=True)]
        result = {"preset": preset, "hosts": len(nodes), "nics": len(topology["nics"]), "peers_per_nic": peers,
                  "windows": windows, "pair_rows_per_window": rows[0], "fabric_model_s": round(model_s, 3),
                  "store_s_median": round(statistics.median(store), 3),
                  "store_cpu_s_median": round(statistics.median(store_cpu), 3),
                  "triangulate_s_median": round(statistics.median(tri), 3),
                  "triangulate_cpu_s_median": round(statistics.median(tri_cpu), 3),
                  "window_s_median": round(statistics.median(per_window), 3),
                  "windows_per_s": round(1 / statistics.median(per_window), 3),
                  "windows_per_s_two_processes": round(
                      1 / max(statistics.median(store), statistics.median(tri)), 3),
                  "store_s": [round(x, 3) for x in store], "triangulate_s": [round(x, 3) for x in tri],
                  "incidents": incidents}
        Cluster.objects.filter(pk=cluster.pk).delete()
        org.delete()
    return result
