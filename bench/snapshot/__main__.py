"""Job snapshots of a 4-rank gloo job: capture stall, background write, restore time, size, overhead.

    python -m bench.snapshot                                  # transformer_lm.py, 4 snapshots, cross-check at 20 s
    python -m bench.snapshot --script mlp_sampler.py --snapshots 6
    python -m bench.snapshot --direct-every 0                 # no cross-check run
    python -m bench.snapshot --help

The training script is one of the unmodified test scripts of ``tests/lockstep/scripts`` under the
real ``lockstep run -- torchrun --nproc-per-node 4``; snapshots are the real ``lockstep snapshot
--job`` and ``--snapshot-every``, the restore the real ``lockstep restore``. Step time is read off
the script's own output (rank 0 prints one line per epoch; each line is time-stamped as it
arrives here), step numbers off ``lockstep``'s job status (heartbeats every 0.1 s here, instead
of 1 s, so the restore's first step is seen within 0.1 s).

Run 1, in one job: a quiet phase of ``--quiet-epochs`` (no snapshot) gives the baseline epoch
time; then ``--snapshots`` on-demand snapshots, each ``--gap-epochs`` after the previous one was
published. Per snapshot:

- **stall**: the manifest's ``paused_s`` -- every rank held at the same step boundary until every
  rank has staged its state into host memory and the hold is released.
- **write**: each rank's background write of its file (``write_s``, the slowest rank), and the
  whole snapshot from the order to the published directory (``duration_s``).
- **lost**: the job's lost time for the snapshot, from the epoch timing: the wall time of the
  epochs that overlap the snapshot (order to publish) minus as many quiet epochs (the median of
  the quiet phase). It contains the stall, the alignment at the hold boundary and the slowdown
  of the steps that run while the files drain.
- **size**: the snapshot's bytes (every rank's file).
- **prepare**: before the first hold each rank starts its capture engine's writer process and
  imports the file writer (``snapshot_prepare``), training going on; only the first snapshot of
  a job pays it, so the first snapshot is reported apart from the steady state.

**Overhead at a 5-minute interval** = median lost time per snapshot (the second and later ones)
/ 300 s. A 5-minute run per snapshot is too long here; the lost time per snapshot does not depend
on the interval as long as one snapshot has drained before the next.

**Restore**: ``lockstep restore`` of the last snapshot, from the launch to the first step after the
snapshot's step on every rank (status), beside the same for the plain ``lockstep run`` launch of
run 1 (launch to first step): the restore's cost over a cold start is the fast-forward to the
boundary and loading the files.

Run 2 (``--direct-every S``, 0 to skip): the same script with ``lockstep run --snapshot-every S``;
overhead measured directly = (mean epoch time of the run) / (median epoch time of run 1's quiet
phase) - 1, and per snapshot as above. A cross-check only: two runs on a shared machine differ by
more than 1 % on their own.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(REPO, "tests", "lockstep", "scripts")
BIN = os.path.dirname(sys.executable)
EPOCH = re.compile(r"\bepoch (\d+) loss\b")
# Steps (optimizer steps for mlp_sampler, micro-batches for transformer_lm) per epoch per rank.
STEPS_PER_EPOCH = {"mlp_sampler.py": 16, "transformer_lm.py": 16}


def load_average() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """``lockstep <subcommand> --job NAME -- torchrun --nproc-per-node 4 SCRIPT OUT EPOCHS``, its output time-stamped."""

    def __init__(self, state: str, name: str, script: str, epochs: int, subcommand: list[str]):
        self.name, self.state = name, state
        self.env = dict(os.environ, LOCKSTEP_STATE_DIR=state, LOCKSTEP_HEARTBEAT_S="0.1", PYTHONUNBUFFERED="1")
        self.env.setdefault("OMP_NUM_THREADS", "1")
        out = os.path.join(state, f"{name}-{time.monotonic_ns()}.pt")
        cmd = [os.path.join(BIN, "lockstep"), *subcommand, "--job", name, "--spares", "0", "--",
               "torchrun", "--nproc-per-node", "4", "--master-port", str(free_port()),
               os.path.join(SCRIPTS, script), out, str(epochs)]
        self.launched = time.time()
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self.epochs: list[float] = []  # wall time each epoch line arrived
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            now = time.time()
            self.lines.append((now, line))
            if EPOCH.search(line):
                self.epochs.append(now)

    def output(self, n: int = 3000) -> str:
        return "".join(line for _, line in self.lines)[-n:]

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([os.path.join(BIN, "lockstep"), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def status(self) -> dict | None:
        from lockstep.cli import JobUnreachable, call_job

        os.environ["LOCKSTEP_STATE_DIR"] = self.state
        try:
            return call_job(self.name, {"op": "status"}, timeout=5).get("status")
        except (JobUnreachable, OSError, ValueError):
            return None

    def wait_for(self, condition, what: str, timeout: float = 600, every: float = 0.02):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job ended while waiting for {what}:\n{self.output()}")
            value = condition()
            if value:
                return value
            time.sleep(every)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.output()}")

    def first_step_after(self, step: int, what: str) -> float:
        """Wall time at which every rank was seen running past ``step``."""
        def past():
            st = self.status()
            return st and all(r["status"] == "running" and r["step"] > step for r in st["ranks"])
        self.wait_for(past, what)
        return time.time()

    def snapshots(self) -> list[dict]:
        return json.loads(self.cli("snapshots", "--job", self.name, "--json").stdout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)


def epoch_times(stamps: list[float]) -> list[tuple[float, float, float]]:
    """(start, end, duration) of each epoch whose start is known (the previous line)."""
    return [(a, b, b - a) for a, b in zip(stamps, stamps[1:], strict=False)]


def lost_time(epochs, start: float, end: float, baseline: float) -> tuple[float, int]:
    """Extra wall time of the epochs overlapping [start, end] over as many baseline epochs."""
    hit = [d for a, b, d in epochs if b >= start and a <= end]
    return sum(hit) - len(hit) * baseline, len(hit)


def snapshot_row(m: dict, epochs, baseline: float, cli_s: float | None = None) -> dict:
    start = m["created"] - m["duration_s"]  # 'created' is when the manifest was written
    lost, n = lost_time(epochs, start, m["created"], baseline)
    return {
        "id": m["id"], "step": m["step"], "bytes": m["bytes"], "stall_s": m["paused_s"],
        "write_s": max(float(r["write_s"] or 0) for r in m["ranks"]),
        "staged_s": max(float(r["staged_s"] or 0) for r in m["ranks"]),
        "duration_s": m["duration_s"], "prepare_s": m.get("prepare_s"), "lost_s": lost, "epochs_overlapped": n, "cli_s": cli_s,
    }


def run_on_demand(args, state: str) -> dict:
    job = Job(state, "bench-snapshot", args.script, args.epochs, ["run"])
    try:
        first = job.first_step_after(0, "the first step")
        launch_s = first - job.launched
        job.wait_for(lambda: len(job.epochs) >= 3, "three epochs (warm-up)")
        quiet_from = len(job.epochs) - 1
        # the baseline: epochs with no snapshot
        job.wait_for(lambda: len(job.epochs) - quiet_from > args.quiet_epochs, "the quiet epochs", every=0.1)
        quiet = [d for _, _, d in epoch_times(job.epochs[quiet_from:])]
        baseline = statistics.median(quiet)
        cli = []
        for _ in range(args.snapshots):
            t0 = time.time()
            done = job.cli("snapshot", "--job", job.name)
            if done.returncode != 0:
                raise RuntimeError(f"lockstep snapshot failed: {done.stderr}\n{job.output()}")
            cli.append((re.match(r"snapshot (\S+) of job", done.stdout).group(1), time.time() - t0))
            after = len(job.epochs)
            job.wait_for(lambda a=after: len(job.epochs) - a >= args.gap_epochs, "the epochs between snapshots", every=0.1)
        manifests = {m["id"]: m for m in job.snapshots()}
        epochs = epoch_times(job.epochs)
        rows = [snapshot_row(manifests[sid], epochs, baseline, cli_s) for sid, cli_s in cli]
        last = manifests[cli[-1][0]]
    finally:
        job.stop()
    restored = Job(state, "bench-snapshot", args.script, args.epochs, ["restore", "--snapshot", last["id"]])
    try:
        first = restored.first_step_after(last["step"], "the first step after the restore")
        restore_s = first - restored.launched
        said = [t for t, line in restored.lines if "restoring from" in line]
    finally:
        restored.stop()
    return {
        "baseline_epoch_s": baseline, "quiet_epochs": len(quiet), "quiet_epoch_spread_s": [min(quiet), max(quiet)],
        "steps_per_epoch": STEPS_PER_EPOCH.get(args.script), "launch_to_first_step_s": launch_s,
        "restore_to_first_step_s": restore_s, "restore_said_s": said[0] - restored.launched if said else None,
        "restored_step": last["step"], "snapshots": rows,
    }


def run_scheduled(args, state: str, baseline: float) -> dict:
    job = Job(state, "bench-snapshot-every", args.script, args.epochs, ["run", "--snapshot-every", f"{args.direct_every}s"])
    try:
        job.first_step_after(0, "the first step")
        job.wait_for(lambda: len(job.epochs) >= 3, "three epochs (warm-up)")
        from_epoch = len(job.epochs) - 1
        time.sleep(args.direct_duration)
        stamps = job.epochs[from_epoch:]
        manifests = [m for m in job.snapshots() if m["created"] - m["duration_s"] >= stamps[0]]
    finally:
        job.stop()
    epochs = epoch_times(stamps)
    mean = sum(d for _, _, d in epochs) / len(epochs)
    rows = [snapshot_row(m, epochs, baseline) for m in manifests if m["created"] <= stamps[-1]]
    return {"every_s": args.direct_every, "span_s": stamps[-1] - stamps[0], "epochs": len(epochs),
            "mean_epoch_s": mean, "overhead": mean / baseline - 1, "snapshots": rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", choices=sorted(STEPS_PER_EPOCH), default="transformer_lm.py")
    parser.add_argument("--epochs", type=int, default=100000, help="the script's epoch count (the bench stops it)")
    parser.add_argument("--quiet-epochs", type=int, default=8, help="baseline epochs before the snapshots")
    parser.add_argument("--snapshots", type=int, default=4, help="on-demand snapshots in run 1")
    parser.add_argument("--gap-epochs", type=int, default=3, help="epochs between one snapshot's publication and the next")
    parser.add_argument("--direct-every", type=float, default=20.0, help="run 2's --snapshot-every in s (0: no run 2)")
    parser.add_argument("--direct-duration", type=float, default=80.0, help="seconds run 2 is measured")
    parser.add_argument("--json", default=None, help="write the results here too")
    args = parser.parse_args(argv)
    header = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
        "script": args.script, "load_before": load_average(),
    }
    print(f"{args.script}, 4 ranks (gloo), load {header['load_before']}", flush=True)
    state = tempfile.mkdtemp(prefix="lockstep-bench-snapshot-")
    try:
        one = run_on_demand(args, state)
        header["load_mid"] = load_average()
        two = run_scheduled(args, state, one["baseline_epoch_s"]) if args.direct_every > 0 else None
    finally:
        shutil.rmtree(state, ignore_errors=True)
    header["load_after"] = load_average()
    result = {**header, "on_demand": one, "scheduled": two}
    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def report(r: dict) -> None:
    one = r["on_demand"]
    spe = one["steps_per_epoch"]
    print(f"\nbaseline: {one['baseline_epoch_s'] * 1e3:.0f} ms per epoch ({spe} steps per rank; "
          f"{one['quiet_epochs']} quiet epochs, {one['quiet_epoch_spread_s'][0] * 1e3:.0f}-"
          f"{one['quiet_epoch_spread_s'][1] * 1e3:.0f} ms)")
    print("| snapshot | step | size KiB | stall ms | staged ms (slowest rank) | write ms (slowest rank) | prepare ms | order → published ms | lost ms | epochs overlapped |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = one["snapshots"]
    for i, s in enumerate(rows, 1):
        print(f"| {i} | {s['step']} | {s['bytes'] / 1024:.0f} | {s['stall_s'] * 1e3:.0f} | {s['staged_s'] * 1e3:.1f} | "
              f"{s['write_s'] * 1e3:.0f} | {(s['prepare_s'] or 0) * 1e3:.0f} | {s['duration_s'] * 1e3:.0f} | "
              f"{s['lost_s'] * 1e3:.0f} | {s['epochs_overlapped']} |")
    steady = rows[1:] or rows
    lost = statistics.median(s["lost_s"] for s in steady)
    stall = statistics.median(s["stall_s"] for s in steady)
    print(f"steady state (snapshots 2-{len(rows)}): median stall {stall * 1e3:.0f} ms, median lost {lost * 1e3:.0f} ms "
          f"per snapshot -> overhead at a 5-minute interval {100 * max(lost, stall) / 300:.3f} % (lost / 300 s; the "
          f"stall alone {100 * stall / 300:.3f} %); the first snapshot lost {rows[0]['lost_s'] * 1e3:.0f} ms")
    print(f"launch to first step: lockstep run {one['launch_to_first_step_s']:.2f} s, lockstep restore "
          f"{one['restore_to_first_step_s']:.2f} s (first step after step {one['restored_step']}"
          + (f"; 'restoring from' after {one['restore_said_s']:.2f} s)" if one["restore_said_s"] is not None else ")"))
    two = r["scheduled"]
    if two:
        lost2 = [s["lost_s"] for s in two["snapshots"]]
        print(f"--snapshot-every {two['every_s']:.0f}s: {len(two['snapshots'])} snapshots in {two['span_s']:.0f} s, "
              f"{two['epochs']} epochs, mean {two['mean_epoch_s'] * 1e3:.0f} ms vs baseline "
              f"{one['baseline_epoch_s'] * 1e3:.0f} ms: {100 * two['overhead']:+.2f} % at {two['every_s']:.0f} s; lost per "
              f"snapshot {', '.join(f'{x * 1e3:.0f}' for x in lost2)} ms")
    print(f"load before {r['load_before']}, between runs {r['load_mid']}, after {r['load_after']}")


if __name__ == "__main__":
    sys.exit(main())
