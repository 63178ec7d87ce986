"""One torchft job: a lighthouse and ``--groups`` replica groups, each its own ``torchrun
--nproc-per-node 1 --max-restarts 100`` (a killed group is restarted and heals from its peers).
Prints rank 0-style ``STEP n t`` lines (from group 0, whichever incarnation) and ``DONE t`` once
every group has finished; exits 0 when all did.

Usage: VENV/bin/python bench/goodput/torchft_job.py OUT --steps N [--width W] [--batch B] [--groups 4]
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def relay(proc, group):
    for line in proc.stdout:
        parts = line.split()
        if parts[:1] == ["STEP"] and len(parts) >= 3:
            if group == 0:
                print(f"STEP {parts[1]} {parts[2]}", flush=True)
        else:
            sys.stdout.write(f"[group {group}] {line}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--groups", type=int, default=4)
    a = ap.parse_args()
    from torchft.coordination import LighthouseServer

    # torchft's defaults, except the join wait: a restarted group rejoins the next quorum.
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000, quorum_tick_ms=100,
                                  heartbeat_timeout_ms=5000)
    env = dict(os.environ, TORCHFT_LIGHTHOUSE=lighthouse.address(), NUM_REPLICA_GROUPS=str(a.groups),
               OMP_NUM_THREADS="1")
    procs = []
    for g in range(a.groups):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--max-restarts", "100", "--master-port", str(free_port()),
               str(HERE / "train_torchft.py"), a.out, "--steps", str(a.steps), "--width", str(a.width),
               "--batch", str(a.batch)]
        p = subprocess.Popen(cmd, env=dict(env, REPLICA_GROUP_ID=str(g)), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=relay, args=(p, g), daemon=True).start()
        procs.append(p)
    codes = [p.wait() for p in procs]
    print(f"DONE {time.time():.6f}", flush=True)
    lighthouse.shutdown()
    sys.exit(0 if all(c == 0 for c in codes) else 1)


if __name__ == "__main__":
    main()
