"""The collective bandwidth test across two emulated hosts: gloo ranks bound to their NICs, the
bus bandwidth through a rate-limited cable is the cable's rate, and the threshold fails it."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from testbed.testing import PY

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]


def collective(fab, hosts_nics: list[tuple[str, str]], **kw) -> list[dict]:
    """Run `python -m agent.audit collective` in each host at once, rank i on hosts_nics[i]."""
    pytest.importorskip("torch")
    init = f"tcp://{fab.nic_address(hosts_nics[0][1])}:{random.randint(20000, 29999)}"
    procs = []
    for rank, (host, nic) in enumerate(hosts_nics):
        args = {"init": init, "world_size": len(hosts_nics), "rank_offset": rank, "ifname": fab.nic_ifname(nic),
                "timeout_s": 120} | kw
        procs.append(fab.spawn(host, [PY, "-m", "agent.audit", "collective", "--args", json.dumps(args)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO),
                               env=os.environ | {"PYTHONPATH": str(REPO)}))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr.decode()
        out.append(json.loads(stdout))
    return out


def test_all_reduce_bus_bandwidth_through_a_rate_limited_cable(small_fabric):
    fab = small_fabric
    pair = [("node0000", "node0000/nic0"), ("node0002", "node0002/nic0")]
    fid = fab.fault_link_rate("node0002/nic0~leaf-su01-r0", rate_mbit=40, direction="both", latency_ms=100)
    try:
        limited = collective(fab, pair, sizes=[4 << 20], iters=3, warmup=1, min_busbw_gbs=0.02)
    finally:
        fab.heal(fid)
    for rank in limited:
        assert rank["errors"] == [], rank["errors"]
        busbw = rank["sizes"][0]["busbw_gbs"]
        # 2 ranks: each sends and receives S per all_reduce, so busbw is the cable's rate in bytes/s
        # (40 Mbit/s = 0.005 GB/s of frames; TCP/IP headers take ~4% of it)
        assert 0.0035 < busbw < 0.0052, busbw
        assert rank["check"]["status"] == "fail" and rank["check"]["code"] == "DCGM_FR_LOW_BANDWIDTH"
    healthy = collective(fab, pair, sizes=[4 << 20], iters=3, warmup=1, min_busbw_gbs=0.02)
    assert all(r["check"]["status"] == "pass" for r in healthy), [r["sizes"] for r in healthy]
