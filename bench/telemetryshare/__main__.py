"""`python -m bench.telemetryshare`: another organization's heartbeat latency while one node floods
the console with telemetry (issue 9, finding 6), with the fair shares on and off.

For each mode: a fresh PostgreSQL database, ONE console process (uvicorn, `DEBUG=false`), two
organizations with a cluster each and one enrolled node each (through the real API). Then

1. quiet: the other organization's node heartbeats back to back for --duration seconds;
2. flood: the same, while the flooding node posts --parallel batches of --batch-kib at once, again
   and again: ignoring Retry-After (modes off and on: a broken or hostile node), or honouring it
   as the agent does (mode polite).

It reports the heartbeat latency p50/p95/max of both phases, and the flood's rows stored per
second and answers by status. Modes `on` and `polite` are the console's defaults; `off` lifts the node's
share (LOCKSTEP_TELEMETRY_NODE_CONCURRENCY 1000, the byte rate unbounded): the console
as it was before them (the turns still go round the organizations). Everything it creates is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
OFF = {"LOCKSTEP_TELEMETRY_NODE_CONCURRENCY": "1000",
       "LOCKSTEP_TELEMETRY_NODE_BYTES_PER_S": str(1 << 40), "LOCKSTEP_TELEMETRY_NODE_BURST_BYTES": str(1 << 40)}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.telemetryshare", description=__doc__.split("\n\n")[0])
    p.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432", help="PostgreSQL server (no database)")
    p.add_argument("--db", default="lockstep_bench_share", help="database created (and dropped) per mode")
    p.add_argument("--modes", default="off,on,polite",
                   help="off: no shares; on: shares, the flood ignores Retry-After; polite: shares, the flood "
                        "honours Retry-After as the agent does (default off,on,polite)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of each phase (default 20)")
    p.add_argument("--parallel", type=int, default=12, help="batches the flooding node posts at once (default 12)")
    p.add_argument("--batch-kib", type=int, default=900, help="size of each flood batch in KiB (default 900)")
    p.add_argument("--out", default="", help="also write the results as JSON to this file")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recreate(pg: str, db: str) -> None:
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')


def drop(pg: str, db: str) -> None:
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def manage(env: dict, *argv: str) -> str:
    done = subprocess.run([PY, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(argv)}: {done.stdout}\n{done.stderr}")
    return done.stdout


def batch_records(size: int) -> bytes:
    """The records of a batch of about `size` bytes, encoded once (the bench's own CPU is the console's)."""
    now = datetime.now(timezone.utc).isoformat()
    records = max(1, min(5000, size // 960))
    return json.dumps([{"kind": "event.job.heartbeat", "ts": now, "data": {"pad": "x" * 900}}
                       for _ in range(records)]).encode()


def batch(seq: int, records: bytes) -> bytes:
    return b'{"seq": %d, "records": %s}' % (seq, records)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def setup(base: str, env: dict) -> tuple[str, str]:
    """Two organizations, a cluster and an enrolled node each: (flooder's credential, quiet one's)."""
    credentials = []
    for org in ("Flood Org", "Quiet Org"):
        token = manage(env, "create_organization", org, "--admin-email",
                       f"{org.split()[0].lower()}@bench.example").strip().splitlines()[-1]
        headers = {"Authorization": f"Bearer {token}"}
        cluster = requests.post(f"{base}/api/v1/clusters/", json={"name": "c"}, headers=headers, timeout=30).json()
        minted = requests.post(f"{base}/api/v1/clusters/{cluster['id']}/enrollment-tokens/", json={},
                               headers=headers, timeout=30).json()
        host = org.split()[0].lower()
        enrolled = requests.post(f"{base}/api/v1/agent/enroll", timeout=30, json={
            "token": minted["token"], "host": {"hostname": host, "machine_id": f"m-{host}"}})
        enrolled.raise_for_status()
        credentials.append(enrolled.json()["credential"])
    return credentials[0], credentials[1]


def heartbeats(base: str, credential: str, duration: float) -> list[float]:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {credential}"
    latencies = []
    end = time.monotonic() + duration
    while time.monotonic() < end:
        start = time.perf_counter()
        session.post(f"{base}/api/v1/agent/heartbeat", json={}, timeout=60).raise_for_status()
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def flood(base: str, credential: str, parallel: int, size: int, stop: threading.Event,
          polite: bool) -> tuple[Counter, int]:
    answers: Counter = Counter()
    rows = [0]
    lock = threading.Lock()
    seq = [0]

    records = batch_records(size)

    def worker() -> None:
        session = requests.Session()
        session.headers.update({"Authorization": f"Bearer {credential}", "Content-Type": "application/json"})
        while not stop.is_set():
            with lock:
                seq[0] += 1
                n = seq[0]
            body = batch(n, records)
            try:
                r = session.post(f"{base}/api/v1/agent/telemetry", data=body, timeout=120)
            except requests.RequestException:
                with lock:
                    answers["error"] += 1
                continue
            with lock:
                answers[r.status_code] += 1
                if r.status_code == 202:
                    rows[0] += r.json().get("accepted", 0)
            if polite and r.status_code == 503:  # as the agent does (agent/backoff.py)
                stop.wait(float(r.headers.get("Retry-After", "1")))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(parallel)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(180)
    return answers, rows[0]


def run_mode(mode: str, opts) -> dict:
    recreate(opts.pg, opts.db)
    var = Path(tempfile.mkdtemp(prefix="lockstep-bench-share-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "DJANGO_"))}
    env.pop("REDIS_URL", None)
    env.update(DATABASE_URL=f"{opts.pg}/{opts.db}", SECRET_KEY="bench-" + secrets.token_urlsafe(32), DEBUG="false",
               LOCKSTEP_HTTPS="false", ALLOWED_HOSTS="127.0.0.1,localhost", LOG_LEVEL="WARNING",
               LOCKSTEP_VAR_DIR=str(var), DB_CONN_MAX_AGE="0", PYTHONUNBUFFERED="1")
    if mode == "off":
        env.update(OFF)
    manage(env, "migrate", "--noinput")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(var / "console.log", "wb")  # noqa: SIM115 - closed below
    console = subprocess.Popen([PY, "-m", "uvicorn", "console.asgi:application", "--host", "127.0.0.1", "--port",
                                str(port), "--lifespan", "off", "--no-access-log"], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{base}/healthz", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the console did not start")
            time.sleep(0.2)
        flooder, quiet = setup(base, env)
        print(f"[{mode}] quiet phase {opts.duration:.0f} s", flush=True)
        calm = heartbeats(base, quiet, opts.duration)
        print(f"[{mode}] flood phase {opts.duration:.0f} s: {opts.parallel} x {opts.batch_kib} KiB", flush=True)
        stop = threading.Event()
        result: dict = {}

        def flooding_node() -> None:
            result["answers"], result["rows"] = flood(base, flooder, opts.parallel, opts.batch_kib * 1024, stop,
                                                      polite=mode == "polite")

        flooding = threading.Thread(target=flooding_node, daemon=True)
        flooding.start()
        time.sleep(1.0)  # the flood under way before measuring
        loaded = heartbeats(base, quiet, opts.duration)
        stop.set()
        flooding.join(240)
    finally:
        console.terminate()
        console.wait(30)
        log.close()
        drop(opts.pg, opts.db)
    seconds = opts.duration + 1.0
    return {
        "mode": mode,
        "quiet_ms": {"n": len(calm), "p50": statistics.median(calm), "p95": percentile(calm, 0.95), "max": max(calm)},
        "flood_ms": {"n": len(loaded), "p50": statistics.median(loaded), "p95": percentile(loaded, 0.95),
                     "max": max(loaded)},
        "flood_rows_per_s": result.get("rows", 0) / seconds,
        "flood_answers": {str(k): v for k, v in result.get("answers", Counter()).items()},
    }


def main(argv: list[str]) -> int:
    opts = parser().parse_args(argv)
    started = datetime.now(timezone.utc)
    results = [run_mode(mode.strip(), opts) for mode in opts.modes.split(",") if mode.strip()]
    machine = (f"{platform.node()}: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
               f"load {os.getloadavg()[0]:.1f}, Python {platform.python_version()}")
    print(f"\n{started:%Y-%m-%d %H:%M} UTC, {machine}")
    print(f"flood: {opts.parallel} parallel {opts.batch_kib} KiB batches from one node (polite: honouring "
          "Retry-After, else ignoring it); "
          f"{opts.duration:.0f} s per phase\n")
    print("| shares | heartbeat p50 / p95 / max, quiet (ms) | heartbeat p50 / p95 / max, flood (ms) | "
          "flood rows stored/s | flood answers |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        q, f = r["quiet_ms"], r["flood_ms"]
        print(f"| {r['mode']} | {q['p50']:.1f} / {q['p95']:.1f} / {q['max']:.0f} | {f['p50']:.1f} / {f['p95']:.1f} / "
              f"{f['max']:.0f} | {r['flood_rows_per_s']:.0f} | "
              f"{', '.join(f'{k}: {v}' for k, v in sorted(r['flood_answers'].items()))} |")
    if opts.out:
        Path(opts.out).write_text(json.dumps({"date": started.isoformat(), "machine": machine,
                                              "options": vars(opts), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
