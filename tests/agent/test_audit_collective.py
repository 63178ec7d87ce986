"""The collective bandwidth test: nccl-tests' bus bandwidth, the threshold check, and real gloo
ranks started as subprocesses (the agent itself never imports torch)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from agent.audit import collective
from agent.audit.thresholds import PROFILES
from agent.commands import ArgError, CommandContext, default_registry, load_modules, validate_args


def test_bus_bandwidth_is_computed_as_nccl_tests_does():
    # nccl-tests doc/PERFORMANCE.md: algbw = S/t; busbw = algbw * factor
    assert collective.bandwidth("all_reduce", 1_000_000_000, 0.01, 8) == pytest.approx((100.0, 175.0))
    assert collective.bandwidth("all_gather", 1_000_000_000, 0.01, 8) == pytest.approx((100.0, 87.5))
    assert collective.bandwidth("reduce_scatter", 2_000_000_000, 0.01, 4) == pytest.approx((200.0, 150.0))
    assert collective.bandwidth("alltoall", 1_000_000_000, 0.02, 2) == pytest.approx((50.0, 25.0))
    assert collective.bandwidth("broadcast", 1_000_000_000, 0.01, 16) == pytest.approx((100.0, 100.0))
    assert collective.bus_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError, match="op 'allreduce'"):
        collective.bus_factor("allreduce", 8)


def test_the_check_uses_the_largest_size_against_the_profile_threshold():
    h100 = PROFILES["h100-sxm"]["collective"]["all_reduce_intra_node_busbw_gbs"]
    timings = [{"size": 1 << 30, "count": 1 << 28, "time_s": (1 << 30) / 1e9 / 200.0, "time_s_max": 0.006},
               {"size": 16 << 30, "count": 4 << 30, "time_s": (16 << 30) / 1e9 / (250.0 / 1.75), "time_s_max": 0.2}]
    rows, check = collective.evaluate("all_reduce", 8, timings, min_busbw_gbs=h100, source="h100-sxm")
    assert [round(r["busbw_gbs"]) for r in rows] == [350, 250]
    assert check["status"] == "fail" and check["code"] == "DCGM_FR_LOW_BANDWIDTH"
    assert check["evidence"]["busbw_gbs"] == pytest.approx(250.0) and check["threshold"]["min_busbw_gbs"] == 460.0
    _, check = collective.evaluate("all_reduce", 8, timings, min_busbw_gbs=200.0)
    assert check["status"] == "pass"
    _, check = collective.evaluate("all_reduce", 8, [{"size": 8, "error": "not supported"}], min_busbw_gbs=1.0)
    assert check["status"] == "error"


def test_two_gloo_ranks_run_as_subprocesses_and_report_bus_bandwidth():
    pytest.importorskip("torch")  # requirements/runtime.txt installs it; the agent does not need it
    load_modules()
    ctype = default_registry.get("audit.collective")
    port = random.randint(20000, 29999)
    args = validate_args(ctype.args, {"init": f"tcp://127.0.0.1:{port}", "world_size": 2, "local_ranks": 2,
                                      "sizes": [1 << 16, 1 << 22], "iters": 5, "warmup": 1, "min_busbw_gbs": 1e-6})
    ctx = CommandContext(command_id="c", type="audit.collective", attempt=1, deadline=1e18)
    result = ctype.handler(args, ctx)
    assert result["format"] == "lockstep.audit.collective/v1" and result["errors"] == []
    assert result["ranks"] == [0, 1] and result["backend"] == "gloo" and result["torch"].startswith("2.13")
    assert [r["size"] for r in result["sizes"]] == [1 << 16, 1 << 22]
    for row in result["sizes"]:
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"])  # 2 ranks: 2(n-1)/n = 1
        assert row["time_us"] > 0 and row["busbw_slowest_rank_gbs"] <= row["busbw_gbs"] * 1.0001
    assert result["status"] == "pass"
    args = validate_args(ctype.args, {"init": f"tcp://127.0.0.1:{port + 1}", "world_size": 2, "local_ranks": 2,
                                      "sizes": [1 << 16], "iters": 2, "warmup": 0, "min_busbw_gbs": 1e6})
    assert ctype.handler(args, ctx)["check"]["code"] == "DCGM_FR_LOW_BANDWIDTH"


def test_the_agent_does_not_import_torch():
    code = ("import sys, agent.audit.commands, agent.audit.collective; from agent.commands import load_modules; "
            "load_modules(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("bad,word", [
    ({"init": "tcp://127.0.0.1:70000"}, "port below 65536"),
    ({"init": "file:///tmp/x"}, "tcp://ADDRESS:PORT"),
    ({"python": "/bin/sh"}, "python interpreter"),
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "NCCL_\\* or GLOO_\\*"),
    ({"rank_offset": 3}, "do not fit"),
])
def test_bad_arguments_are_refused_with_their_name(bad, word):
    load_modules()
    ctype = default_registry.get("audit.collective")
    args = validate_args(ctype.args, {"init": "tcp://127.0.0.1:29500", "world_size": 2} | bad)
    with pytest.raises(ArgError, match=word):
        ctype.handler(args, CommandContext(command_id="c", type="audit.collective", attempt=1, deadline=1e18))
