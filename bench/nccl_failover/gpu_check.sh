#!/bin/sh
# A real NCCL collective through libnccl-net-lockstep.so, for a machine with NVIDIA GPUs.
# NOT RUN so far: no GPU machine was lent to this task (see README.md). From the repository root:
#
#   sh bench/nccl_failover/gpu_check.sh            # writes bench/nccl_failover/gpu_check.out
#
# It builds the plugin, forces NCCL onto the network transport (no P2P, no SHM) with
# NCCL_NET_PLUGIN pointing at the library, and records whether NCCL loaded it ("NET/Plugin"
# and "NET/Lockstep" lines of NCCL_DEBUG=INFO) and the all-reduce bus bandwidth. NCCL refuses two
# ranks on one GPU, so with fewer than 2 GPUs it only checks that a 1-rank communicator loads and
# initializes the plugin (no bandwidth). Needs python with torch (CUDA build).
set -eu
cd "$(dirname "$0")/../.."
OUT=bench/nccl_failover/gpu_check.out
make -s -C nccl_plugin
LIB="$(pwd)/nccl_plugin/build/libnccl-net-lockstep.so"
PY="${PYTHON:-python3}"
NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
NIC="$(ip -o -4 addr show up | awk '$2 != "lo" {print $2; exit}')"
WORLD=2
[ "$NGPU" -ge 2 ] || WORLD=1
export NCCL_NET_PLUGIN="$LIB" NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    LOCKSTEP_NCCL_NICS="${LOCKSTEP_NCCL_NICS:-$NIC}" LOCKSTEP_AGENT_SOCKET=none
cat > /tmp/lockstep_nccl_allreduce.py <<'PYEOF'
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(rank)
x = torch.ones(64 << 20, device="cuda")  # 256 MiB of float32
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
t = time.perf_counter()
n = 10
for _ in range(n):
    dist.all_reduce(x)
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / n
size = x.numel() * 4
busbw = size / dt * (2 * (world - 1) / world) / 1e9 if world > 1 else 0.0
if rank == 0:
    print(f"RESULT world={world} bytes={size} time_s={dt:.4f} busbw_GBps={busbw:.2f}", flush=True)
dist.destroy_process_group()
PYEOF
"$PY" -m torch.distributed.run --standalone --nproc_per_node="$WORLD" /tmp/lockstep_nccl_allreduce.py > "$OUT" 2>&1 || true
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  host: $(hostname)  gpus: $NGPU  world: $WORLD"
    echo "plugin loaded: $(grep -c 'NET/Lockstep\|Loaded net plugin Lockstep\|NET/Plugin.*Lockstep' "$OUT" || true) matching NCCL lines"
    grep 'RESULT' "$OUT" || echo "no RESULT line: see $OUT"
} | tee -a "$OUT"
