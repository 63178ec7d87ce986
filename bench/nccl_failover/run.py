"""NIC failover benchmark of libnccl-net-lockstep.so between two namespaces (testbed.ncclpair).

    sudo .venv/bin/python bench/nccl_failover/run.py [--faults 100] [--kinds link_down,loss,flap]
                                                     [--no-throughput] [--out results.json]

Faults: one long checksummed transfer (the ctypes harness, as NCCL drives the plugin) while the
primary NIC of the sending host is, --faults times per kind, taken down (`ip link set down`),
made 100% lossy (nftables drop in and out) or flapped (down/up three times, 150 ms each), then
restored; after each restore the plugin must fail back before the next fault. Per fault:
  detection  fault injected -> the plugin's nccl.failover event (its own CLOCK_REALTIME stamp)
  failover   last acknowledgement on the primary -> first on the standby (the plugin's
             nccl.path_state "carrying" event, failover_ms)
  stall      the longest gap between two completed receives around the fault, as the
             application sees it (the harness's receive times)
and at the end: every byte compared, no group lost or duplicated.

Throughput/latency (--no-faults for only these): bench/nccl_failover/tput.c, the plugin (2
streams, its default, and 1 stream) against plain TCP over one stream on nh0 between the same
namespaces, 4 KiB to 4 MiB (bandwidth with 32 outstanding, ping-pong latency), taking turns run
by run. --compare-lib PATH adds another build of the plugin (an earlier commit's, say) as one
more transport taking its turn: an A/B in the same minutes. --sizes / --modes narrow the table;
--syscalls SIZE counts the syscalls per message of each side instead (strace -c).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.clusterclock import ClusterClock  # noqa: E402
from agent.localsock.server import EventQueue, LocalSocketServer  # noqa: E402
from testbed.ncclpair import HARNESS, PLUGIN_DIR, NcclPair  # noqa: E402
from testbed.testing import unique_prefix  # noqa: E402

LIB = PLUGIN_DIR / "build" / "libnccl-net-lockstep.so"
TPUT = PLUGIN_DIR / "build" / "tput"
SIZES = [4096, 65536, 1 << 20, 4 << 20]


class Events:
    def __init__(self, path: Path):
        self.queue = EventQueue()
        self.server = LocalSocketServer(path, self.queue, ClusterClock())
        self.server.bind()
        self.items: list[tuple[str, float, dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            self.server.serve_once(0.02)

    def wait(self, after: int, pred, timeout: float):
        """The first event past index `after` matching pred(kind, data): (index, ts, data) or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.items += self.queue.take(10000, 0.02)
            for i in range(after, len(self.items)):
                kind, ts, data = self.items[i]
                if pred(kind, data):
                    return i, ts, data
        return None

    def close(self):
        self._stop.set()
        self._thread.join()
        self.server.close()


def inject(pair: NcclPair, kind: str) -> None:
    if kind == "link_down":
        pair.link("a", "nh0", up=False)
    elif kind == "loss":
        pair.lossy("a", "nh0", on=True)
    else:  # flap: down/up/down/up/down, restored below
        for _ in range(2):
            pair.link("a", "nh0", up=False)
            time.sleep(0.15)
            pair.link("a", "nh0", up=True)
            time.sleep(0.15)
        pair.link("a", "nh0", up=False)


def restore(pair: NcclPair, kind: str) -> None:
    if kind == "loss":
        pair.lossy("a", "nh0", on=False)
    else:
        pair.link("a", "nh0", up=True)


def faults(pair: NcclPair, n: int, kinds: list[str]) -> dict:  # noqa: C901 - one measured sequence
    work = Path(tempfile.mkdtemp(prefix="lsnccl-bench"))
    events = Events(Path(tempfile.mkdtemp(prefix="lsb", dir="/tmp")) / "agent.sock")
    env = dict(os.environ, LOCKSTEP_NCCL_NICS="nh0,nh1", LOCKSTEP_AGENT_SOCKET=str(events.server.path),
               LOCKSTEP_NCCL_FAILBACK_STABLE_MS="300")
    procs = {}
    for role, host in (("recv", "b"), ("send", "a")):
        argv = [sys.executable, HARNESS, role, "--lib", str(LIB), "--dir", str(work), "--until-stop", "--seed", "3"]
        if role == "recv":
            argv.append("--trace")
        procs[role] = pair.popen(host, argv, env=env, stdout=open(work / f"{role}.out", "w"),  # noqa: SIM115
                                 stderr=open(work / f"{role}.err", "w"))  # noqa: SIM115
    while not (work / "progress").exists():  # (or a side ended: the summary below says why)
        if any(p.poll() is not None for p in procs.values()):
            break
        time.sleep(0.05)
    per_fault = []
    seen = 0
    try:
        for kind in kinds:
            for i in range(n):
                if any(p.poll() is not None for p in procs.values()):
                    per_fault.append({"kind": kind, "i": i, "t0": time.time(), "missed": "the transfer ended"})
                    break
                t0 = time.time()
                inject(pair, kind)
                fo = events.wait(seen, lambda k, d: k == "nccl.failover" and d.get("from") == "nh0", 30)
                while fo is not None and fo[1] < t0:  # a spurious one before this fault (counted below)
                    fo = events.wait(fo[0] + 1, lambda k, d: k == "nccl.failover" and d.get("from") == "nh0", 30)
                if fo is None:  # (the primary was not active: the next fault waits for it, below)
                    moves = [(k, round((ts - t0) * 1e3, 1), d.get("from"), d.get("to"), d.get("reason"))
                             for k, ts, d in events.items if k in ("nccl.failover", "nccl.failback")]
                    per_fault.append({"kind": kind, "i": i, "t0": t0, "missed": "no failover",
                                      "last_moves_ms_from_fault": moves[-4:]})
                    print(json.dumps(per_fault[-1]), flush=True)
                    t_restore = time.time()
                    restore(pair, kind)
                    back = events.wait(seen, lambda k, d: k in ("nccl.failback", "nccl.failover") and d.get("to") == "nh0",
                                       20)
                    while back is not None and back[1] < t_restore:
                        back = events.wait(back[0] + 1, lambda k, d: k in ("nccl.failback", "nccl.failover")
                                           and d.get("to") == "nh0", 20)
                    if back is not None:
                        seen = back[0] + 1
                    continue
                seen = fo[0] + 1
                # only when data was waiting at the failover (else there is nothing to time)
                carrying = events.wait(seen, lambda k, d: k == "nccl.path_state" and d.get("state") == "carrying", 1)
                time.sleep(0.2)  # the fault lasts a little longer, then goes
                t_restore = time.time()
                restore(pair, kind)
                # back on the primary: a failback, or (when the standby had died too) a failover to it
                # (on a loaded machine a flap's up phase can outlast the stable time: a failback
                # during the flap is not the one after the restore)
                def to_primary(k, d):
                    return k in ("nccl.failback", "nccl.failover") and d.get("to") == "nh0"
                fb = events.wait(seen, to_primary, 20)
                while fb is not None and fb[1] < t_restore:
                    fb = events.wait(fb[0] + 1, to_primary, 20)
                # detection counts from the injection (for a flap: its first down)
                rec = {"kind": kind, "i": i, "t0": t0, "detection_ms": round((fo[1] - t0) * 1e3, 1),
                       "reason": fo[2].get("reason")}
                if carrying:
                    rec["failover_ms"] = carrying[2].get("failover_ms")
                if fb is None:
                    rec["missed"] = "no failback"
                else:
                    seen = fb[0] + 1
                    rec["failback_after_restore_ms"] = round((fb[1] - t_restore) * 1e3, 1)
                per_fault.append(rec)
                print(json.dumps(rec), flush=True)
    finally:
        (work / "stop").touch()
        results = {}
        for role, proc in procs.items():
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
            lines = (work / f"{role}.out").read_text().splitlines()
            results[role] = json.loads(lines[-1]) if lines else {"ok": False, "error": "no output"}
        events.close()
    completions = results["recv"].pop("completions", [])
    for rec in per_fault:  # the application's stall: longest gap between completions around the fault
        window = [t for t in completions if rec["t0"] - 1.0 <= t <= rec["t0"] + 5.0]
        gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
        rec["stall_ms"] = round(max(gaps) * 1e3, 1) if gaps else None
    quiet = [b - a for a, b in zip(completions, completions[1:], strict=False)]
    # failovers no fault caused: the machine's load starved a process past the heartbeat time
    injected = [r["t0"] for r in per_fault]
    spurious = [ts for k, ts, d in events.items if k == "nccl.failover" and d.get("from") not in (None, "none")
                and not any(t0 <= ts <= t0 + 5 for t0 in injected)]
    shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for kind in kinds:
        recs = [r for r in per_fault if r["kind"] == kind and "missed" not in r]

        def stat(field, recs=recs):
            vals = sorted(r[field] for r in recs if r.get(field) is not None)
            if not vals:
                return None
            p95 = vals[max(0, -(-95 * len(vals) // 100) - 1)]  # nearest rank
            return {"n": len(vals), "median": statistics.median(vals), "p95": p95, "max": vals[-1]}

        summary[kind] = {"faults": sum(1 for r in per_fault if r["kind"] == kind), "completed": len(recs),
                         "detection_ms": stat("detection_ms"), "failover_ms": stat("failover_ms"),
                         "stall_ms": stat("stall_ms")}
    send, recv = results["send"], results["recv"]
    intact = bool(send.get("ok") and recv.get("ok") and send.get("groups") == recv.get("groups")
                  and send.get("bytes") == recv.get("bytes"))
    return {"summary": summary, "intact": intact, "bytes": recv.get("bytes"), "groups": recv.get("groups"),
            "errors": [r.get("error") for r in (send, recv) if r.get("error")],
            "spurious_failovers": len(spurious),
            "median_gap_between_completions_ms": round(statistics.median(quiet) * 1e3, 2) if quiet else None,
            "faults": per_fault}


# The plugin with its default 2 streams per path, the plugin with 1 stream, and plain TCP over
# one stream (blocking send/recv of whole messages, TCP_NODELAY): the same namespaces, NIC and sizes.
TRANSPORTS = {"plugin": ("plugin", {}, LIB), "plugin_1stream": ("plugin", {"LOCKSTEP_NCCL_STREAMS": "1"}, LIB),
              "tcp": ("tcp", {}, None)}


def _tput_once(pair: NcclPair, transport: str, size: int, iters: int, mode: str,
               strace: dict[str, Path] | None = None) -> tuple[float | None, str]:
    """One tput run; ``strace`` (side -> file) runs each side under ``strace -c -f -o FILE``."""
    kind, extra, lib = TRANSPORTS[transport]
    env = dict(os.environ, LOCKSTEP_NCCL_NICS="nh0,nh1", LOCKSTEP_AGENT_SOCKET="none", **extra)
    d = tempfile.mkdtemp(prefix="lsnccl-tput")
    args = [str(lib), d] if kind == "plugin" else [pair.address("b", "nh0"), "6001"]

    def wrap(side):
        return ["strace", "-c", "-f", "-o", str(strace[side])] if strace else []

    far = pair.popen("b", [*wrap("b"), str(TPUT), kind, *args, "b", str(size), str(iters), mode], env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    near = subprocess.run(["ip", "netns", "exec", pair.ns["a"], *wrap("a"), str(TPUT), kind, *args, "a", str(size),
                           str(iters), mode], env=env, capture_output=True, text=True, timeout=600)
    try:
        far.wait(60)
    except subprocess.TimeoutExpired:
        far.kill()
    shutil.rmtree(d, ignore_errors=True)
    lines = near.stdout.strip().splitlines()
    if not lines:
        return None, near.stderr.strip()[-300:]
    out = json.loads(lines[-1])
    return out["MBps"] if mode == "bw" else out["one_way_us"], ""


def _iters(size: int, run_bytes: int = 256 << 20) -> dict[str, int]:
    """Messages per run: bandwidth moves ``run_bytes`` (at least 200 messages); latency a fixed count."""
    return {"bw": max(200, run_bytes // max(size, 1)), "lat": 1000 if size <= 65536 else 200}


def tput(pair: NcclPair, repeats: int, sizes: list[int], modes: list[str], run_bytes: int = 256 << 20) -> list[dict]:
    """Median of `repeats` runs per cell; the transports take turns run by run, so a change in
    the machine's load hits them alike."""
    rows = []
    for size in sizes:
        iters = _iters(size, run_bytes)
        for mode in modes:
            row: dict = {"size": size, "mode": mode, "load1": os.getloadavg()[0]}
            vals: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
            for _ in range(repeats):
                for transport in TRANSPORTS:
                    val, err = _tput_once(pair, transport, size, iters[mode], mode)
                    if val is None:  # recorded, not hidden: the row says how many runs failed
                        row.setdefault("failed_runs", []).append(f"{transport}: {err}")
                    else:
                        vals[transport].append(val)
            for transport in TRANSPORTS:
                row[transport] = statistics.median(vals[transport]) if vals[transport] else None
                row[f"{transport}_runs"] = vals[transport]
            for transport in [t for t in TRANSPORTS if t != "tcp"]:
                if row[transport] and row["tcp"]:
                    ratio = row["tcp"] / row[transport] if mode == "bw" else row[transport] / row["tcp"]
                    row[f"{transport}_overhead_pct"] = round(ratio * 100 - 100, 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def parse_strace_c(text: str) -> dict[str, dict[str, int]]:
    """``strace -c`` summary -> {syscall: {"calls", "errors"}} (the total line left out)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 5 or not parts[-1].isidentifier() or parts[-1] == "total" or not parts[3].isdigit():
            continue
        errors = int(parts[4]) if len(parts) == 6 else 0
        out[parts[-1]] = {"calls": int(parts[3]), "errors": errors}
    return out


def syscalls(pair: NcclPair, size: int, repeats: int) -> list[dict]:
    """Syscalls per message on each side of a bw run (sender a, receiver b), every transport,
    warm-up and set-up included; strace slows each side several times, so the time-gated parts
    (the progress thread's timers, a caller's empty re-reads) read as upper bounds."""
    iters = _iters(size)["bw"]
    messages = iters + max(iters // 10, (32 << 20) // max(size, 1))  # tput.c's warmup_iters()
    rows = []
    with tempfile.TemporaryDirectory(prefix="lsnccl-strace") as d:
        for turn in range(repeats):
            for transport in TRANSPORTS:
                files = {side: Path(d) / f"{transport}.{turn}.{side}" for side in ("a", "b")}
                _, err = _tput_once(pair, transport, size, iters, "bw", strace=files)
                row: dict = {"transport": transport, "size": size, "messages": messages, "turn": turn,
                             "load1": os.getloadavg()[0]}
                for side, role in (("a", "sender"), ("b", "receiver")):
                    counts = parse_strace_c(files[side].read_text()) if files[side].exists() else {}
                    row[role] = {"per_message": round(sum(c["calls"] for c in counts.values()) / messages, 3),
                                 "by_call": {k: round(c["calls"] / messages, 3) for k, c in sorted(counts.items())
                                             if c["calls"] / messages >= 0.005},
                                 "errors_per_message": round(sum(c["errors"] for c in counts.values()) / messages, 3)}
                if err:
                    row["error"] = err
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("transport", "turn")} |
                                 {r: row[r]["per_message"] for r in ("sender", "receiver")}), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--kinds", default="link_down,loss,flap")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--no-faults", action="store_true", help="only the throughput/latency table")
    parser.add_argument("--repeats", type=int, default=3, help="runs per throughput cell (median)")
    parser.add_argument("--out", default=str(Path(__file__).with_name("results.json")))
    parser.add_argument("--compare-lib", help="another libnccl-net-lockstep.so, measured as transport plugin_compare")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="throughput message sizes in bytes")
    parser.add_argument("--run-bytes", type=int, default=256 << 20,
                        help="bytes one bandwidth run moves (at least 200 messages); more gives steadier medians")
    parser.add_argument("--modes", default="bw,lat", help="throughput modes: bw (bandwidth), lat (latency)")
    parser.add_argument("--syscalls", type=int, metavar="SIZE",
                        help="instead of the throughput table: syscalls per SIZE-byte message on each side "
                             "(strace -c), --repeats turns of every transport; no fault run")
    args = parser.parse_args()
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: {args.sizes!r}: a comma list of byte counts")
    if any(n < 0 for n in sizes) or (args.syscalls is not None and args.syscalls < 0):
        parser.error("--sizes / --syscalls: a message size cannot be negative")
    modes = args.modes.split(",")
    if args.run_bytes <= 0:
        parser.error(f"--run-bytes: {args.run_bytes}: must be positive")
    if set(modes) - {"bw", "lat"}:
        parser.error(f"--modes: {args.modes!r}: each must be bw or lat")
    if args.compare_lib:
        TRANSPORTS["plugin_compare"] = ("plugin", {}, Path(args.compare_lib).resolve())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # killed: still tear the namespaces down
    subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR)], check=True)
    subprocess.run(["cc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{PLUGIN_DIR}/include",
                    "-o", str(TPUT), str(Path(__file__).with_name("tput.c")), "-ldl"], check=True)
    pair = NcclPair.create("nb" + unique_prefix()[1:5])
    try:
        out: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
               "cpus": os.cpu_count(), "load1_at_start": os.getloadavg()[0], "kernel": platform.release()}
        if not args.no_faults and args.syscalls is None:
            out["failover"] = faults(pair, args.faults, args.kinds.split(","))
        if args.syscalls is not None:
            out["syscalls"] = syscalls(pair, args.syscalls, args.repeats)
        elif not args.no_throughput:
            out["throughput"] = tput(pair, args.repeats, sizes, modes, args.run_bytes)
        out["load1_at_end"] = os.getloadavg()[0]
    finally:
        pair.destroy()
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    failover = out.get("failover")
    brief = {k: v for k, v in out.items() if k != "failover"}
    if failover:
        brief |= {"summary": failover["summary"], "intact": failover["intact"]}
    print(json.dumps(brief, indent=1))
    return 0 if failover is None or failover["intact"] else 1


if __name__ == "__main__":
    sys.exit(main())
