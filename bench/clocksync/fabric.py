"""Emulated-fabric benchmark: Lockstep's clock sync against the truth and against chrony.

    sudo .venv/bin/python -m bench.clocksync fabric                 # 6 hosts, 300 s idle + 300 s loaded
    sudo .venv/bin/python -m bench.clocksync fabric --duration 30   # a quick run

1. An emulated fabric (``testbed.Fabric``): ``--hosts`` hosts on two leaves and a spine, one
   NIC each (one spine: every cross-leaf packet crosses the same links). Every host gets a random virtual clock (offset ±50 ms, drift ±50 ppm, the
   test-only variables of ``agent.clocksync.clock``), so the truth is known.
2. Each host runs the agent's prober (``python -m agent.clocksync.probe``) bound to its NIC,
   with ``--peers`` peers (a ring plus chords: many short loops), and rewrites each pair's last
   2-s trace every 2 s.
3. Every round, this process estimates every pair (``agent.clocksync.fit``), brings the pair
   offsets to one instant with their drifts, and solves the graph (``workers.clocksolve``,
   offsets and drifts), with host 0 as the reference. Without the network effect, a host's
   offset is the chain of raw pair estimates along a shortest path from the reference.
4. Error of synchronized time for every host pair: (x̂ᵢ − x̂ⱼ) − (xᵢ − xⱼ), and of drift.
5. In the same run, chrony 4 (Debian ``chrony``) as a measurement-only client (``chronyd -x``,
   ``minpoll -4 maxpoll -4 xleave``) in the last host against a chronyd server (``local
   stratum 1``, also ``-x``) in host 0, across the spine like the probes. The namespaces share
   one kernel clock, so chrony's true offset is 0: the offset it tracks (``chronyc tracking``,
   System time: with ``-x`` the whole correction it would apply) is its error, read every round.
6. Phase ``idle``, then phase ``loaded``: every leaf-0 → spine link limited to 20 Mbit/s
   (``tc tbf``, 5 ms queue) and on/off UDP cross-traffic from a leaf-0 host to a leaf-1 host
   averaging about 70 % of it: one direction of every cross-leaf path queues, the other not.

Results: per phase p50/p99 of |error| (with and without the network effect; chrony),
|drift error|, convergence time (from the first probe until every pair's error stays within
the bound printed), and the CPU of clock probing (prober processes) and of estimation.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np

from agent.clocksync.clock import ClockSource
from agent.clocksync.fit import EstimateError, estimate
from agent.clocksync.trace import TraceError, parse_trace
from testbed import Fabric, generate
from testbed.testing import unique_prefix
from workers.clocksolve import parse_graph, solve

REPO = Path(__file__).resolve().parents[2]
ROUND_S = 2.0
CONVERGED_NS = 1000.0  # a pair is converged when its synchronized-time error is below 1 µs

BLASTER = r"""
import random, socket, sys, time
dst, port, on_mbit, on_ms, off_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
payload = b"x" * 1200
per_ms = on_mbit * 1e6 / 8 / 1200 / 1000
rng = random.Random(7)
while True:
    end = time.monotonic() + rng.expovariate(1000 / on_ms)
    owed = 0.0
    while time.monotonic() < end:
        owed += per_ms
        while owed >= 1:
            try:
                s.sendto(payload, (dst, port))
            except OSError:
                pass
            owed -= 1
        time.sleep(0.001)
    time.sleep(rng.expovariate(1000 / off_ms))
"""
SINK = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
while True:
    s.recv(2048)
"""


def real_instant(source: ClockSource, local_ns: int) -> int:
    real = local_ns - source.offset_ns
    for _ in range(3):
        real = local_ns - (source.transform(real) - real)
    return real


def probe_graph(hosts: list[str], peers: int, rng) -> list[tuple[str, str]]:
    n = len(hosts)
    edges = {(min(i, (i + 1) % n), max(i, (i + 1) % n)) for i in range(n)}  # a ring
    want = max(2, min(peers, n - 1))
    for i in range(n):
        others = [j for j in rng.permutation(n) if j != i]
        for j in others:
            if sum(1 for e in edges if i in e) >= want:
                break
            if sum(1 for e in edges if j in e) < want + 1:
                edges.add((min(i, j), max(i, j)))
    return sorted((hosts[a], hosts[b]) for a, b in edges)


def chain_offsets(ref: str, hosts: list[str], pair: dict) -> dict[str, float]:
    """Offsets from raw pair estimates along BFS paths from the reference (no network effect)."""
    adj: dict[str, list[tuple[str, float]]] = {h: [] for h in hosts}
    for (a, b), off in pair.items():
        adj[a].append((b, off))
        adj[b].append((a, -off))
    out, queue = {ref: 0.0}, deque([ref])
    while queue:
        u = queue.popleft()
        for v, off in sorted(adj[u]):
            if v not in out:
                out[v] = out[u] + off
                queue.append(v)
    return out


def chrony_conf(directory: Path, server: str | None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    lines = [f"pidfile {directory}/chronyd.pid", f"driftfile {directory}/drift", "cmdport 0",
             f"bindcmdaddress {directory}/chronyd.sock", f"logdir {directory}",
             "log measurements statistics tracking"]
    if server:
        lines += [f"server {server} minpoll -4 maxpoll -4 xleave iburst", "port 0"]
    else:
        lines += ["local stratum 1", "allow all"]
    path = directory / "chrony.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def chrony_tracking(socket_path: Path) -> dict | None:
    """chronyd's own estimate of the system clock against its server (``chronyc -c tracking``).

    With ``-x`` chronyd never corrects the clock: it keeps the correction it would make, and
    ``System time`` is that whole estimated offset (the statistics log's offsets are only the
    residuals after it). The namespaces share the kernel clock, so the truth is 0 and this is
    chrony's error; ``Frequency`` likewise is its drift error.
    """
    try:
        line = subprocess.run(["chronyc", "-c", "-h", str(socket_path), "tracking"], capture_output=True, text=True,
                              timeout=5, check=True).stdout.strip().splitlines()[0]
        fields = line.split(",")
        return {"t": time.time(), "offset_ns": float(fields[4]) * 1e9, "last_offset_ns": float(fields[5]) * 1e9,
                "freq_ppm": float(fields[7]), "stratum": int(fields[2])}
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        return None


def _pct(values, q) -> float:
    return float(np.percentile(np.abs(values), q)) if len(values) else float("nan")


def _cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def main(args) -> int:
    if os.geteuid() != 0:
        print("the fabric benchmark needs root (network namespaces)", file=sys.stderr)
        return 2
    if not shutil.which("chronyd"):
        print("chronyd is missing: apt-get install chrony (scripts/setup-host.sh installs it)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    out = Path(args.out or tempfile.mkdtemp(prefix="lockstep-clockbench-"))
    out.mkdir(parents=True, exist_ok=True)
    phases = [p for p in args.phases.split(",") if p]
    n = args.hosts
    topo = generate(hosts=n, rails=1, hosts_per_leaf=math.ceil(n / 2), spines=1)
    prefix = unique_prefix()
    load_before = os.getloadavg()
    fab = Fabric.up(topo, prefix=prefix, base_dir=out / "testbed")
    procs: list[subprocess.Popen] = []
    try:
        hosts = sorted(fab.plan.hosts)
        ref = hosts[0]
        epoch = time.time_ns()
        clocks = {h: ClockSource(offset_ns=int(rng.uniform(-50e6, 50e6)), drift_ppm=float(rng.uniform(-50, 50)),
                                 epoch_ns=epoch) for h in hosts}
        addr = {h: fab.nic_address(f"{h}/nic0") for h in hosts}
        edges = probe_graph(hosts, args.peers, rng)
        neighbours = {h: sorted({b for a, b in edges if a == h} | {a for a, b in edges if b == h}) for h in hosts}
        total_s = args.duration * len(phases)
        traces = out / "traces"
        traces.mkdir(exist_ok=True)
        # chrony: server in the reference host, measurement-only client in the last host.
        chrony_dir = out / "chrony"
        server_conf = chrony_conf(chrony_dir / "server", None)
        client_conf = chrony_conf(chrony_dir / "client", addr[ref])
        for host, conf in ((ref, server_conf), (hosts[-1], client_conf)):
            log = open(conf.parent / "chronyd.out", "w")  # noqa: SIM115 (lives as long as the process)
            procs.append(fab.spawn(host, ["chronyd", "-x", "-d", "-u", "root", "-f", str(conf)], stdout=log,
                                   stderr=subprocess.STDOUT))
        probers = {}
        for h in hosts:
            c = clocks[h]
            env = {**os.environ, "PYTHONPATH": str(REPO), "LOCKSTEP_TEST_CLOCK_OFFSET_NS": str(c.offset_ns),
                   "LOCKSTEP_TEST_CLOCK_DRIFT_PPM": repr(c.drift_ppm), "LOCKSTEP_TEST_CLOCK_EPOCH_NS": str(epoch)}
            argv = [sys.executable, "-m", "agent.clocksync.probe", "--name", h, "--bind", addr[h], "--rate",
                    str(args.rate), "--window", str(ROUND_S), "--every", str(ROUND_S), "--duration",
                    str(total_s + 2 * ROUND_S), "--out", str(traces)]
            for p in neighbours[h]:
                argv += ["--peer", f"{p}={addr[p]}"]
            log = open(out / f"prober-{h}.log", "w")  # noqa: SIM115
            probers[h] = fab.spawn(h, argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            procs.append(probers[h])
        start = time.monotonic()
        print(f"fabric {prefix}: {n} hosts, {len(edges)} probed pairs, phases {phases} × {args.duration:.0f} s, "
              f"output {out}", flush=True)
        rounds: list[dict] = []
        chrony: list[dict] = []
        est_cpu = 0.0
        x_prev: dict[str, float] = {}
        load_started = None
        k = 0
        while True:
            k += 1
            wake = start + k * ROUND_S + 0.3
            elapsed = time.monotonic() - start
            if elapsed >= total_s:
                break
            phase = phases[min(int(elapsed // args.duration), len(phases) - 1)]
            if phase == "loaded" and load_started is None:
                load_started = elapsed
                _start_load(fab, hosts, addr, procs, out)
            time.sleep(max(0.0, wake - time.monotonic()))
            t_cpu = time.process_time()
            pair: dict[tuple[str, str], dict] = {}
            for a, b in edges:
                path = traces / f"{a}~{b}.json"
                try:
                    text = path.read_text()
                    if args.keep_traces:
                        (traces / f"{a}~{b}.r{k}.json").write_text(text)
                    trace = parse_trace(json.loads(text))
                    est = estimate(trace)
                except (OSError, ValueError, TraceError, EstimateError):
                    continue
                pair[a, b] = {"offset": est.offset_ns, "drift": est.drift_ppm, "sigma": max(est.sigma_ns, 0.5),
                              "t_ref": trace.t_ref_ns}
            est_cpu += time.process_time() - t_cpu
            tracked = chrony_tracking(chrony_dir / "client" / "chronyd.sock")
            if tracked and tracked["stratum"] > 0:
                tracked["phase"] = phase
                tracked["elapsed"] = time.monotonic() - start
                chrony.append(tracked)
            if not pair:
                continue
            # One instant for every pair: the reference clock reading R; host a reads R + x_a then.
            r_ref = max(p["t_ref"] - x_prev.get(a, 0.0) for (a, _), p in pair.items())
            sol = None
            for _ in range(2):
                at = {e: p["offset"] + p["drift"] * 1e-6 * (r_ref + x_prev.get(e[0], 0.0) - p["t_ref"])
                      for e, p in pair.items()}
                graph = {"format": "lockstep.clockgraph/v1", "reference": ref, "nodes": hosts,
                         "edges": [{"a": a, "b": b, "offset_ns": at[a, b], "sigma_ns": p["sigma"],
                                    "drift_ppm": p["drift"], "drift_sigma_ppm": p["sigma"] * 1e-3}
                                   for (a, b), p in pair.items()]}
                sol = solve(parse_graph(graph)).to_document()
                x_prev = {h: v for h, v in sol["offsets_ns"].items()}
            chain = chain_offsets(ref, hosts, at)
            real = real_instant(clocks[ref], int(r_ref))
            truth = {h: float(clocks[h].transform(real) - clocks[ref].transform(real)) for h in hosts}
            true_drift = {h: clocks[h].drift_ppm - clocks[ref].drift_ppm for h in hosts}
            known = [h for h in hosts if h in sol["offsets_ns"]]
            err = {h: sol["offsets_ns"][h] - truth[h] for h in known}
            cerr = {h: chain[h] - truth[h] for h in hosts if h in chain}
            pairs_err = [err[i] - err[j] for ii, i in enumerate(known) for j in known[ii + 1:]]
            pairs_chain = [cerr[i] - cerr[j] for ii, i in enumerate(sorted(cerr)) for j in sorted(cerr)[ii + 1:]]
            drift_err = [sol["drift_ppm"][h] - true_drift[h] for h in known if h != ref]
            raw_edge = [at[a, b] - (truth[b] - truth[a]) for a, b in at]
            rounds.append({"t": elapsed, "phase": phase, "edges": len(pair), "hosts": len(known),
                           "pairs": pairs_err, "pairs_chain": pairs_chain, "drift": drift_err, "raw_edge": raw_edge,
                           "flagged": len(sol["flagged"]), "sigma_p50": float(np.median([p["sigma"] for p in pair.values()]))})
            print(f"t={elapsed:6.1f}s {phase:6s} pairs {len(pair)}/{len(edges)} |err| max {_pct(pairs_err, 100):9.1f} ns "
                  f"(chain {_pct(pairs_chain, 100):9.1f}) drift max {_pct(drift_err, 100):.4f} ppm "
                  f"flagged {len(sol['flagged'])}", flush=True)
        cpu_probers = {}
        for h, p in probers.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=3 * ROUND_S + 10)
            stats_path = traces / f"{h}.stats.json"
            if stats_path.exists():
                cpu_probers[h] = json.loads(stats_path.read_text())
        result = _summarize(rounds, phases, args, chrony, cpu_probers, est_cpu, edges)
        result.update({"epoch_ns": epoch, "hosts": n, "edges": len(edges), "rate_hz": args.rate, "load_before": load_before,
                       "load_after": os.getloadavg(), "output": str(out),
                       "clocks": {h: {"offset_ns": c.offset_ns, "drift_ppm": c.drift_ppm} for h, c in clocks.items()}})
        (out / "rounds.json").write_text(json.dumps(rounds))
        (out / "chrony.json").write_text(json.dumps(chrony))
        print(json.dumps({k: v for k, v in result.items() if k != "clocks"}, indent=1, default=float))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1, default=float))
        return 0
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
            if p.poll() is None:
                p.kill()
        fab.down()


def _start_load(fab: Fabric, hosts: list[str], addr: dict, procs: list, out: Path) -> None:
    leaf0 = next(lid.split("~", 1)[1] for lid in fab.plan.links if lid.startswith(f"{hosts[0]}/nic0~"))
    for lid in fab.plan.links:
        if lid.startswith(f"{leaf0}~spine"):
            fab.fault_link_rate(lid, rate_mbit=20, direction="a>b", latency_ms=5)
    src, dst = hosts[1], hosts[-2]
    sink = fab.spawn(dst, [sys.executable, "-c", SINK, addr[dst], "9"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    blaster = fab.spawn(src, [sys.executable, "-c", BLASTER, addr[dst], "9", "40", "25", "20"],
                        stdout=open(out / "blaster.log", "w"), stderr=subprocess.STDOUT)  # noqa: SIM115
    procs += [sink, blaster]


def _summarize(rounds, phases, args, chrony, cpu_probers, est_cpu, edges) -> dict:
    res: dict = {"phases": {}}
    for phase in phases:
        rs = [r for r in rounds if r["phase"] == phase]
        settle = [r for r in rs if r["t"] - (rs[0]["t"] if rs else 0) >= 10.0] or rs
        pairs = [e for r in settle for e in r["pairs"]]
        chain = [e for r in settle for e in r["pairs_chain"]]
        drift = [e for r in settle for e in r["drift"]]
        raw = [e for r in settle for e in r["raw_edge"]]
        t0 = phases.index(phase) * args.duration
        chs = [c for c in chrony if c["phase"] == phase and c["elapsed"] - t0 >= 10.0]
        ch = [c["offset_ns"] for c in chs]
        ch_freq = [c["freq_ppm"] for c in chs]
        ch_last = [c["last_offset_ns"] for c in chs]
        res["phases"][phase] = {
            "rounds": len(settle), "pair_samples": len(pairs),
            "sync_error_p50_ns": _pct(pairs, 50), "sync_error_p99_ns": _pct(pairs, 99),
            "without_network_effect_p50_ns": _pct(chain, 50), "without_network_effect_p99_ns": _pct(chain, 99),
            "raw_pair_error_p50_ns": _pct(raw, 50), "raw_pair_error_p99_ns": _pct(raw, 99),
            "drift_error_p50_ppm": _pct(drift, 50), "drift_error_p99_ppm": _pct(drift, 99),
            "chrony_offset_error_p50_ns": _pct(ch, 50), "chrony_offset_error_p99_ns": _pct(ch, 99),
            "chrony_last_offset_p50_ns": _pct(ch_last, 50), "chrony_last_offset_p99_ns": _pct(ch_last, 99),
            "chrony_samples": len(ch), "chrony_drift_error_p50_ppm": _pct(ch_freq, 50),
            "chrony_drift_error_p99_ppm": _pct(ch_freq, 99),
            "p99_ratio_vs_chrony": _pct(pairs, 99) / _pct(ch, 99) if ch else float("nan"),
            "flagged_edges_mean": float(np.mean([r["flagged"] for r in settle])) if settle else 0.0,
        }
    first = rounds[0]["t"] if rounds else float("nan")
    full = [r for r in rounds if r["edges"] == len(edges)]
    conv = float("nan")
    idle = [r for r in rounds if r["phase"] == phases[0]]
    for i, r in enumerate(idle):
        if all(_pct(x["pairs"], 100) < CONVERGED_NS for x in idle[i:]):
            conv = r["t"]
            break
    res["convergence"] = {"first_estimate_s": first, "all_pairs_estimated_s": full[0]["t"] if full else float("nan"),
                          f"all_pairs_within_{CONVERGED_NS:.0f}ns_s": conv,
                          "note": "seconds from the probers' start; estimates come every 2 s from 2-s windows"}
    wall = max((s.get("wall_s", 0) for s in cpu_probers.values()), default=0) or 1
    res["cpu"] = {"prober_process_cores_mean": float(np.mean([s["process_cpu_s"] / s["wall_s"] for s in cpu_probers.values()]))
                  if cpu_probers else float("nan"),
                  "prober_loop_cores_mean": float(np.mean([s["cpu_s"] / s["wall_s"] for s in cpu_probers.values()]))
                  if cpu_probers else float("nan"),
                  "packets_per_s_per_host": float(np.mean([(s["sent"] + s["received"]) / s["wall_s"]
                                                          for s in cpu_probers.values()])) if cpu_probers else 0,
                  "estimation_cpu_s_per_pair_window": est_cpu / max(sum(r["edges"] for r in rounds), 1),
                  "wall_s": wall}
    res["tx_stamp_ratio"] = float(np.mean([s["tx_stamps"] / max(s["sent"], 1) for s in cpu_probers.values()])) \
        if cpu_probers else float("nan")
    return res
