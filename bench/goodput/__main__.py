"""Goodput under hard failures: the same job on the same machine in one run, for

* ``plain``      -- torchrun, no failure (the reference time, and the per-step time);
* ``lockstep``   -- ``lockstep run -- torchrun ...``, no failure (steady-state overhead) and with
  a ``kill -9`` of a random worker every ``--mtbf-s`` seconds (goodput, failure-to-resumed time);
* ``torchrun``   -- ``torchrun --max-restarts`` with a DCP checkpoint every K steps, K from the
  Young/Daly interval sqrt(2 * delta * MTBF) with delta the checkpoint cost measured first, with
  the same failures;
* ``torchft``    -- torchft 0.2.0 (pinned in ``requirements-torchft.txt``; this command installs
  it into ``var/bench-torchft``, a venv that uses ``.venv``'s torch): the same model written for
  torchft (``train_torchft.py``), one replica group per process, a lighthouse, the same
  failures; a killed group is restarted by its torchrun and heals from its peers.
  ``--torchft-steps N`` runs it for the first N steps only, its goodput then against plain's
  time to step N.

Goodput is the failure-free training time over the variant's training time for the same number
of steps (training time: from the first ``STEP`` line to the last step, so the variants' start-up
and exit, which no failure changes, do not count); wall times are reported beside it.
One command: ``python -m bench.goodput`` (``--help`` for the knobs); results go to
``bench/goodput/results.json`` and are printed as a table with the date, machine and load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = Path(sys.executable).parent
TRAIN = HERE / "train.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


class Run:
    """A job in the background, its STEP/DONE lines collected, workers found by a marker."""

    def __init__(self, cmd: list[str], env: dict | None = None):
        self.marker = uuid.uuid4().hex
        self.env = dict(os.environ, BENCH_RUN=self.marker, PYTHONUNBUFFERED="1", **(env or {}))
        self.t_start = time.time()
        # A session of its own, so a stalled job can be killed with every process it started.
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, cwd=ROOT, start_new_session=True)
        self.stalled: dict | None = None
        self.steps: list[tuple[int, float]] = []
        self.ckpts: list[float] = []
        self.done_at: float | None = None
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.log.append(line)
            parts = line.split()
            if len(parts) == 3 and parts[0] == "STEP":
                self.steps.append((int(parts[1]), float(parts[2])))
            elif len(parts) == 3 and parts[0] == "CKPT":
                self.ckpts.append(float(parts[2]))
            elif len(parts) == 2 and parts[0] == "DONE":
                self.done_at = float(parts[1])

    def train_s(self, steps: int) -> float:
        """First STEP line to the last step (the STEP line of the final step, else DONE)."""
        end = next((t for n, t in self.steps if n >= steps), None) or self.done_at or time.time()
        return end - self.steps[0][1]

    def marked(self) -> list[tuple[int, bytes, bytes]]:
        """(pid, environ, cmdline) of every live process started under this run's marker."""
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"BENCH_RUN={self.marker}".encode() in env:
                found.append((int(pid), env, cmd))
        return found

    def workers(self) -> list[int]:
        """The ranks' processes: not the warm spares, nor the shadows (spares that follow a rank)."""
        return [pid for pid, env, cmd in self.marked()
                if b"\0RANK=" in b"\0" + env and b"/train" in cmd and b"lockstep.runtime.spare" not in cmd
                and b"\0LOCKSTEP_SHADOW=1" not in b"\0" + env]

    def first_step_time(self, timeout=600) -> float:
        deadline = time.time() + timeout
        while not self.steps:
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("the job never started training:\n" + "".join(self.log[-40:]))
            time.sleep(0.05)
        return self.steps[0][1]

    def wait(self, stall_s: float, timeout=7200) -> int | None:
        """The job's exit code, or None when it stopped making progress: no STEP line for
        ``stall_s`` seconds once training began (``stall_s`` plus 600 s of start-up before). A
        stalled job is recorded (last step, how long, the workers' stacks where py-spy is on the
        PATH), then killed with its whole session, so one hung variant does not hang the bench."""
        deadline = time.time() + timeout
        while self.proc.poll() is None:
            last = self.steps[-1][1] if self.steps else self.t_start + 600
            if time.time() - last > stall_s or time.time() > deadline:
                self._record_stall(last)
                os.killpg(self.proc.pid, signal.SIGKILL)
                for pid, _env, _cmd in self.marked():  # torchrun puts its workers in sessions of their own
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.proc.wait()
                return None
            time.sleep(0.5)
        time.sleep(0.2)
        return self.proc.returncode

    def _record_stall(self, since: float):
        stacks = {}
        spy = shutil.which("py-spy")
        for pid in self.workers() if spy else []:
            dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
            stacks[pid] = (dump.stdout or dump.stderr)[:4000]  # innermost frames first
        self.stalled = {"last_step": self.steps[-1][0] if self.steps else None, "since": since,
                        "stalled_s": round(time.time() - since, 1), "stacks": stacks or "py-spy not on PATH",
                        "log_tail": "".join(self.log[-80:])}

    def step_time(self, skip: int = 100) -> float:
        pts = [p for p in self.steps if p[0] > skip]
        gaps = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:], strict=False) if b[0] > a[0]]
        return statistics.median(gaps) if gaps else float("nan")


def inject_failures(run: Run, mtbf_s: float, rng: random.Random, kills: list[float], restart=None):
    """kill -9 a random worker every mtbf_s seconds of the job's training time, until it ends."""
    t0 = run.first_step_time()
    n = 1
    while run.proc.poll() is None:
        at = t0 + n * mtbf_s
        while time.time() < at and run.proc.poll() is None:
            time.sleep(0.05)
        if run.proc.poll() is not None or run.done_at is not None:
            return
        pids = run.workers()
        if pids:
            victim = rng.choice(pids)
            try:
                os.kill(victim, signal.SIGKILL)
                kills.append(time.time())
                if restart:
                    restart(victim)
            except ProcessLookupError:
                pass
        n += 1


def kill_times(run: Run, kills: list[float]) -> list[float]:
    """When each kill came, in seconds of training time (from the first STEP line)."""
    return [round(k - run.steps[0][1], 2) for k in kills] if run.steps else []


def job_args(a, out: Path) -> list[str]:
    return [str(TRAIN), str(out), "--steps", str(a.steps), "--width", str(a.width), "--batch", str(a.batch)]


def run_plain(a, tmp: Path) -> dict:
    run = Run([str(BIN / "torchrun"), "--nproc-per-node", "4", "--master-port", str(free_port()),
               *job_args(a, tmp / "plain.pt")])
    assert run.wait(a.stall_s) == 0, "".join(run.log[-40:])
    return {"wall_s": time.time() - run.t_start, "train_s": run.train_s(a.steps), "step_s": run.step_time(),
            "train_s_first": {str(a.torchft_steps): run.train_s(a.torchft_steps)}}


def run_lockstep(a, tmp: Path, failures: bool, rng) -> dict:
    state = tmp / f"state-{uuid.uuid4().hex[:6]}"
    name = f"bench-{uuid.uuid4().hex[:8]}"
    env = {"LOCKSTEP_STATE_DIR": str(state)}
    run = Run([str(BIN / "lockstep"), "run", "--job", name, "--spares", str(a.spares), "--", "torchrun",
               "--nproc-per-node", "4", "--master-port", str(free_port()), *job_args(a, tmp / f"{name}.pt")], env)
    kills: list[float] = []
    if failures:
        threading.Thread(target=inject_failures, args=(run, a.mtbf_s, rng, kills), daemon=True).start()
    code = run.wait(a.stall_s)
    res = {"wall_s": time.time() - run.t_start, "train_s": run.train_s(a.steps),
           "step_s": run.step_time(), "exit": code, "failures": len(kills), "kills_at_s": kill_times(run, kills),
           "stalled": run.stalled}
    hist = json.loads((state / "jobs" / name / "state.json").read_text())["history"]
    rec = [h["failure_to_resumed_s"] for h in hist if h["kind"] == "job.migration_finished" and "failure_to_resumed_s" in h]
    res["resume_s"] = rec
    return res


def measure_checkpoint_cost(a, tmp: Path) -> float:
    d = tmp / "ckpt-calibrate"
    d.mkdir(exist_ok=True)
    run = Run([str(BIN / "torchrun"), "--nproc-per-node", "4", "--master-port", str(free_port()),
               str(TRAIN), str(tmp / "cal.pt"), "--steps", "120", "--width", str(a.width), "--batch", str(a.batch),
               "--ckpt-dir", str(d), "--ckpt-every", "20"])
    assert run.wait(a.stall_s) == 0, "".join(run.log[-40:])
    return statistics.median(run.ckpts)


def run_torchrun_dcp(a, tmp: Path, step_s: float, rng) -> dict:
    delta = measure_checkpoint_cost(a, tmp)
    tau = math.sqrt(2 * delta * a.mtbf_s)  # Young's interval (Daly's correction is < 1% here)
    k = max(1, round(tau / step_s))
    d = tmp / f"ckpt-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    # torch 2.13's c10d rendezvous hands the workers of every restart round the same shared
    # TCPStore with the same keys (dynamic_rendezvous.py reuses its store server; the "new store
    # per retry" that rendezvous.py assumes is not made), so a restarted rank reads a dead rank's
    # gloo address from the round before: "Gloo connectFullMesh failed ... Connection refused" on
    # every restart (reproduced with one kill, 2026-12-03). torch's documented opt-out of the
    # sharing gives each round a fresh store; with it one kill restarts and finishes.
    run = Run([str(BIN / "torchrun"), "--nproc-per-node", "4", "--max-restarts", "100", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", d.name,
               *job_args(a, tmp / "tr.pt"), "--ckpt-dir", str(d), "--ckpt-every", str(k)],
              {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    kills: list[float] = []
    threading.Thread(target=inject_failures, args=(run, a.mtbf_s, rng, kills), daemon=True).start()
    code = run.wait(a.stall_s)
    return {"wall_s": time.time() - run.t_start, "train_s": run.train_s(a.steps), "exit": code,
            "failures": len(kills), "kills_at_s": kill_times(run, kills), "ckpt_every": k, "ckpt_cost_s": delta,
            "young_interval_s": tau, "stalled": run.stalled}


TORCHFT_VENV = ROOT / "var" / "bench-torchft"


def torchft_python() -> Path:
    """var/bench-torchft: a venv that sees .venv's packages (torch is not reinstalled) with the
    pinned torchft on top."""
    py = TORCHFT_VENV / "bin" / "python"
    if not py.exists():
        import site

        subprocess.run([sys.executable, "-m", "venv", str(TORCHFT_VENV)], check=True)
        pth = next((TORCHFT_VENV / "lib").glob("python3*/site-packages")) / "lockstep-venv.pth"
        pth.write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                    str(HERE / "requirements-torchft.txt")], check=True)
    return py


def run_torchft(a, tmp: Path, rng) -> dict:
    run = Run([str(torchft_python()), str(HERE / "torchft_job.py"), str(tmp / "tf.pt"), "--steps", str(a.torchft_steps),
               "--width", str(a.width), "--batch", str(a.batch)], {"RUST_LOG": "warn"})
    kills: list[float] = []
    threading.Thread(target=inject_failures, args=(run, a.mtbf_s, rng, kills), daemon=True).start()
    code = run.wait(a.stall_s)
    return {"wall_s": time.time() - run.t_start, "train_s": run.train_s(a.torchft_steps), "step_s": run.step_time(),
            "steps": a.torchft_steps, "exit": code, "failures": len(kills), "kills_at_s": kill_times(run, kills),
            "stalled": run.stalled}


def goodput(plain: dict, res: dict, steps: int | None = None) -> float | None:
    """Failure-free training time over the variant's (for its first ``steps`` steps when it ran
    fewer than the others); none for a job that did not finish."""
    ref = plain["train_s_first"][str(steps)] if steps else plain["train_s"]
    return ref / res["train_s"] if res["exit"] == 0 else None


def outcome(res: dict) -> str:
    if res["exit"] == 0:
        return f"goodput {res['goodput'] * 100:.1f}%"
    if res.get("stalled"):
        st = res["stalled"]
        return f"DID NOT FINISH: no step for {st['stalled_s']:.0f} s after step {st['last_step']} (stacks in results.json)"
    return f"DID NOT FINISH: exit {res['exit']}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.goodput", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20000, help="training steps of the job (default 20000)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--mtbf-s", type=float, default=180.0, help="seconds between injected failures (default 180)")
    ap.add_argument("--spares", type=int, default=20)
    ap.add_argument("--variants", default="plain,lockstep-free,lockstep,torchrun,torchft")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stall-s", type=float, default=240.0,
                    help="a variant with no step for this long is recorded as stalled and killed (default 240)")
    ap.add_argument("--torchft-steps", type=int, default=0,
                    help="steps of the torchft variant when fewer than --steps (its per-step quorum makes it the slowest);"
                         " its goodput is then against plain's time to that step (default: --steps)")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    a = ap.parse_args(argv)
    if a.steps <= 20 or not 0 <= a.torchft_steps <= a.steps:
        ap.error(f"--steps {a.steps} / --torchft-steps {a.torchft_steps}: need steps > 20 and 0 <= torchft-steps <= steps")
    a.torchft_steps = a.torchft_steps or a.steps
    rng = random.Random(a.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    variants = a.variants.split(",")
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.node()} {os.cpu_count()} cores "
               f"({cpu_model()}) {platform.platform()}", "load_before": load(), "config": vars(a), "variants": {}}
    print(f"goodput bench: {a.steps} steps, width {a.width}, a failure every {a.mtbf_s:.0f} s; "
          f"{results['machine']}; load {results['load_before']}")
    plain = run_plain(a, tmp)
    results["variants"]["plain"] = plain
    print(f"  plain torchrun, no failure: train {plain['train_s']:.1f} s ({plain['step_s'] * 1000:.2f} ms/step)")
    if "lockstep-free" in variants:
        free = run_lockstep(a, tmp, False, rng)
        free["overhead"] = free["step_s"] / plain["step_s"] - 1
        results["variants"]["lockstep-free"] = free
        print(f"  lockstep, no failure: train {free['train_s']:.1f} s ({free['step_s'] * 1000:.2f} ms/step, "
              f"overhead {free['overhead'] * 100:+.1f}%)")
    if "lockstep" in variants:
        ls = run_lockstep(a, tmp, True, rng)
        ls["goodput"] = goodput(plain, ls)
        results["variants"]["lockstep"] = ls
        print(f"  lockstep, {ls['failures']} failures (exit {ls['exit']}): train {ls['train_s']:.1f} s, {outcome(ls)}, "
              f"failure->resumed {', '.join(f'{r:.2f}' for r in ls['resume_s'])} s")
    if "torchrun" in variants:
        tr = run_torchrun_dcp(a, tmp, plain["step_s"], rng)
        tr["goodput"] = goodput(plain, tr)
        results["variants"]["torchrun-dcp"] = tr
        print(f"  torchrun --max-restarts + DCP every {tr['ckpt_every']} steps (Young: sqrt(2 x {tr['ckpt_cost_s']:.3f} s"
              f" x {a.mtbf_s:.0f} s) = {tr['young_interval_s']:.1f} s), {tr['failures']} failures: {tr['wall_s']:.1f} s, "
              f"{outcome(tr)}")
    if "torchft" in variants:
        tf = run_torchft(a, tmp, rng)
        tf["goodput"] = goodput(plain, tf, a.torchft_steps)
        results["variants"]["torchft"] = tf
        print(f"  torchft 0.2.0, {a.torchft_steps} steps, {tf['failures']} failures (exit {tf['exit']}): train {tf['train_s']:.1f} s "
              f"({tf['step_s'] * 1000:.2f} ms/step), {outcome(tf)}")
    results["load_after"] = load()
    Path(a.out).write_text(json.dumps(results, indent=1))
    print(f"  load after: {results['load_after']}; results in {a.out}")


if __name__ == "__main__":
    main()
