"""Pieces of the simulated fleet that need no console: latency histograms, payloads, the CLI."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys

import pytest

from console.fleet.services import validate_inventory
from console.telemetry.services import parse_batch
from testbed.fleet import FleetConfig, Histogram, payloads


def test_histogram_percentiles_are_within_a_few_percent_of_the_exact_ones():
    rng = random.Random(3)
    values = [rng.lognormvariate(-4, 1.5) for _ in range(20000)]
    hist = Histogram()
    for v in values:
        hist.add(v)
    ordered = sorted(values)
    for q in (50, 90, 99):
        exact = ordered[int(len(ordered) * q / 100) - 1]
        assert abs(hist.percentile(q) - exact) / exact < 0.05, q
    assert hist.count == len(values) and hist.max == max(values)
    other = Histogram()
    other.add(100.0)
    hist.merge(other)
    assert hist.max == 100.0 and hist.count == len(values) + 1
    assert Histogram().summary() == {"count": 0, "mean_ms": 0.0, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0,
                                     "max_ms": 0.0}


def test_payloads_are_what_the_console_accepts_and_stable_per_host():
    mid = payloads.machine_id("sim", 4)
    assert mid == payloads.machine_id("sim", 4) != payloads.machine_id("sim", 5) and len(mid) == 32
    doc = payloads.inventory(payloads.hostname("sim", 4), mid, gpus=8, rails=4)
    validate_inventory(doc)
    assert len(doc["gpus"]) == 8 and [n["device"] for n in doc["nics"]] == ["nic0", "nic1", "nic2", "nic3", "mgmt0"]
    seq, dropped, records = parse_batch(
        {"seq": 1, "records": payloads.telemetry_records(random.Random(0), 50, rails=2)}, 5000)
    assert (seq, dropped, len(records)) == (1, 0, 50)
    health = payloads.health(random.Random(0), gpus=2, rails=2, uptime_s=12.5)
    assert health["ok"] is True and len(health["gpus"]) == 2 and health["uptime_s"] == 12.5


def test_a_config_needs_a_token_or_a_state_file():
    with pytest.raises(ValueError, match="enrollment token"):
        FleetConfig(console="http://127.0.0.1:1", token="", agents=1)
    assert FleetConfig(console="http://x/", token="", agents=1, state_file="s.json").console == "http://x"


def test_the_cli_explains_itself_and_refuses_bad_arguments():
    helped = subprocess.run([sys.executable, "-m", "testbed.fleet", "run", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert helped.returncode == 0
    for option in ("--console", "--token", "--agents", "--cluster", "--heartbeat", "--telemetry-every", "--records",
                   "--duration", "--report", "--state"):
        assert option in helped.stdout
    refused = subprocess.run([sys.executable, "-m", "testbed.fleet", "run", "--console", "http://127.0.0.1:1",
                              "--agents", "-3"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "must be ≥ 0" in refused.stderr


def test_a_busy_answer_carries_the_consoles_retry_after_to_the_simulated_agent():
    from aiohttp import web

    from testbed.fleet.agent import Transient
    from testbed.fleet.fleet import Fleet, FleetConfig

    async def busy(request):
        return web.json_response({"error": "busy"}, status=503, headers={"Retry-After": "10"})

    async def main():
        app = web.Application()
        app.router.add_post("/api/v1/agent/telemetry", busy)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with Fleet(FleetConfig(console=f"http://127.0.0.1:{port}", token="lse_x", agents=1)) as fleet:
                agent = fleet.agents[0]
                with pytest.raises(Transient) as refused:
                    await agent._call("telemetry", "POST", "/api/v1/agent/telemetry", body={}, timeout=5)
                return refused.value.retry_after_s, agent.stats.errors
        finally:
            await runner.cleanup()

    retry_after, errors = asyncio.run(main())
    assert retry_after == 10.0 and errors["telemetry:503"] == 1
