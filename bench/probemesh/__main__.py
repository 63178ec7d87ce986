"""The probe mesh's CPU cost: per 1,000 probes/s, and for the full default plan of an 8-NIC host.

    python -m bench.probemesh                         # native: 1x8, 8x46 (1,024 GPUs), 8x64; python: 1x10
    python -m bench.probemesh --cases native:8x46,native:8x46@50 --seconds 20 --json out.json

A case `ENGINE:NxP[@MS]` is one host of N NICs, each probing P peers every MS (default
`--interval-ms`, 10 ms); ENGINE is `native`, `python`, or `native-notx` (the plan's
`tx_timestamps: false`: user-space send times instead of kernel TX stamps, on both hosts):
the host under test runs `MeshRunner` (the activity's shell) in this process with ENGINE; a
second process (`python -m agent.probemesh run`, native) plays the N x P peers: N NICs on other
loopback addresses, each probing the host under test's NICs with as many peers, so the host
under test answers as many probes as it sends, as in a full mesh. Source ports: the plan's
default set (115 per NIC at 16 paths, coverage 0.99), path discovery off (its cost is separate,
about 50 traces per second). Measured over `--seconds` after a warm-up:

- **helper**: CPU (user + system) of `lockstep-probed` (its own getrusage), in cores;
- **driver**: CPU of this process's runner (the agent's side: control, records, path state);
- probes sent per second (measured), answered by this host per second, windows, loss.

Per probe-op (one probe sent and its echo handled, or one probe answered) the CPU is
(helper + driver CPU) / (sent + answered); **cores per 1,000 probes/s** is the cost of sending
1,000 probes/s and answering as many (2 x 1,000 probe-ops), and the **8-NIC plan** column
projects the default plan (8 NICs x 46 peers every 10 ms: 36,800 sent and 36,800 answered per
second). On a machine too busy to give the helper the CPU it asks for, the helper falls behind
and skips slots (`skipped`): the rate is then lower than asked, and late answers count as loss,
but the CPU per probe-op stays what it costs.

The 1,024-GPU plan has 46 peers per NIC (31 on the same leaf, 7 on the same host, 8 across
leaves; workers/probeplan, `python -m bench.triangulation plan`); 64 is a margin for repairs.
Results: bench/probemesh/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from agent.commands.registry import validate_args
from agent.probemesh import plan as planmod
from agent.probemesh.runner import MeshRunner

REPO = Path(__file__).resolve().parents[2]


def host_plan(prefix: str, nics: int, peers: int, far: str, engine: str, interval_ms: float, sport_first: int,
              tx_timestamps: bool = True) -> dict:
    own = [f"127.{prefix}.0.{i + 1}" for i in range(nics)]
    remote = [f"127.{far}.0.{i + 1}" for i in range(nics)]
    plan = {"nics": [], "interval_ms": interval_ms, "engine": engine, "sport_first": sport_first,
            "paths": {"enabled": False}, "tx_timestamps": tx_timestamps}
    for i, addr in enumerate(own):
        plan["nics"].append({"name": f"h{prefix}/nic{i}", "address": addr,
                             "peers": [[f"h{far}-{k}/nic{k % nics}", remote[(i + k) % nics]] for k in range(peers)]})
    return plan


def thread_cpu(fn):
    out = {}

    def run():
        t0 = time.thread_time()
        fn()
        out["cpu"] = time.thread_time() - t0

    t = threading.Thread(target=run)
    t.start()
    return t, out


def bench_case(engine: str, nics: int, peers: int, seconds: float, warmup: float, interval_ms: float) -> dict:
    records: list[dict] = []
    tx = not engine.endswith("-notx")
    engine = engine.removesuffix("-notx")
    plan = planmod.check(validate_args(planmod.ARGS, host_plan("10", nics, peers, "20", engine, interval_ms, 40000,
                                                               tx)))
    far = host_plan("20", nics, peers, "10", "native", interval_ms, 42000, tx)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(far, f)
    peer_proc = subprocess.Popen([sys.executable, "-m", "agent.probemesh", "run", f.name], cwd=str(REPO),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    runner = MeshRunner(lambda kind, data: records.append(data))
    stats: dict = {}
    try:
        runner.apply(plan)
        end_warm = time.monotonic() + warmup
        while time.monotonic() < end_warm:
            runner.step(0.1)
        s0 = dict(runner.helper_stats)
        n_rec0 = len(records)
        t0 = time.monotonic()
        proc_cpu0 = time.process_time()

        def loop():
            end = t0 + seconds
            while time.monotonic() < end:
                runner.step(0.1)

        th, cpu = thread_cpu(loop)
        th.join()
        wall = time.monotonic() - t0
        s1 = runner.helper_stats
        window_records = records[n_rec0:]
        stats = {
            "engine": runner.engine.kind, "tx_timestamps": tx, "nics": nics, "peers_per_nic": peers, "interval_ms": interval_ms,
            "sport_count": plan["sport_count"], "seconds": round(wall, 2),
            "sent_per_s": round((s1.get("sent", 0) - s0.get("sent", 0)) / wall),
            "answered_per_s": round((s1.get("answered_probes", 0) - s0.get("answered_probes", 0)) / wall),
            "helper_cores": None, "driver_cores": round(cpu["cpu"] / wall, 4),
            "process_cores": round((time.process_time() - proc_cpu0) / wall, 4),
            "windows": len(window_records),
            "skipped": s1.get("skipped", 0) - s0.get("skipped", 0),
        }
        if runner.engine.kind == "native":
            stats["helper_cores"] = round((s1["cpu_ns"] - s0["cpu_ns"]) / 1e9 / wall, 4)
        else:  # the Python engine runs in the driver's thread
            stats["helper_cores"] = 0.0
        sent = sum(p["sent"] for r in window_records for p in r["probes"] if p["via"] == "probe")
        lost = sum(p["lost"] for r in window_records for p in r["probes"] if p["via"] == "probe")
        stats["loss"] = round(lost / sent, 5) if sent else None
        total = stats["helper_cores"] + stats["driver_cores"]
        stats["total_cores"] = round(total, 4)
        ops = stats["sent_per_s"] + stats["answered_per_s"]
        stats["cpu_us_per_probe_op"] = round(total / ops * 1e6, 2) if ops else None
        stats["cores_per_1000_probes_s"] = round(2000 * total / ops, 4) if ops else None
        stats["plan_8x46_cores"] = round(2 * 36_800 * total / ops, 3) if ops else None
    finally:
        runner.close()
        peer_proc.terminate()
        peer_proc.wait(timeout=10)
        os.unlink(f.name)
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probemesh")
    ap.add_argument("--cases", default="native:1x8,native:8x46@50,native-notx:8x46@50,native:8x46,native:8x64,"
                                       "python:1x10",
                    help="ENGINE:NICSxPEERS, comma-separated")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--interval-ms", type=float, default=10.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": f"{platform.node()} {platform.machine()} "
            f"{os.cpu_count()} CPUs, {platform.platform()}", "load_before": os.getloadavg()}
    print(f"# {meta['date']} on {meta['machine']}; load average {meta['load_before']}", flush=True)
    print("| case | sent/s | answered/s | helper cores | driver cores | CPU µs per probe-op | "
          "cores per 1,000 probes/s | 8-NIC plan, cores | loss | skipped |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    results = []
    for case in args.cases.split(","):
        engine, shape = case.split(":")
        shape, _, at = shape.partition("@")
        interval = float(at) if at else args.interval_ms
        nics, peers = (int(x) for x in shape.split("x"))
        r = bench_case(engine, nics, peers, args.seconds, args.warmup, interval)
        results.append(r)
        print(f"| {engine} {nics}x{peers} every {interval:g} ms | {r['sent_per_s']:,} | {r['answered_per_s']:,} | "
              f"{r['helper_cores']} | {r['driver_cores']} | {r['cpu_us_per_probe_op']} | "
              f"{r['cores_per_1000_probes_s']} | {r['plan_8x46_cores']} | {r['loss']} | {r['skipped']} |", flush=True)
    meta["load_after"] = os.getloadavg()
    print(f"# load average after: {meta['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
