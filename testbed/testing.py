"""Helpers to drive traffic through an emulated fabric, for tests, benchmarks and the demo.

    srv = start_server(fab, "node0002", ["serve", "--port", "7000"])
    result = probe(fab, "node0000/nic0", "node0002/nic0", count=200, flows=50)
    stop(srv)

`probe` runs `testbed.probe send` inside the source NIC's host, from that NIC's address.
"""

from __future__ import annotations

import json
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Callable

from .fabric import Fabric

PY = sys.executable


def unique_prefix() -> str:
    """A random testbed prefix ("t" + 6 hex digits), for tests that must not collide."""
    return "t" + secrets.token_hex(3)


def wait_for(condition: Callable[[], object], timeout: float, what: str, interval: float = 0.02):
    """Poll `condition` until it returns something truthy (returned); TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def start_server(fab: Fabric, host: str, argv: list[str], timeout: float = 10.0) -> subprocess.Popen:
    """Spawn a `testbed.probe` server (serve, sink, tcp-sink) in `host`; wait for its "ready"."""
    proc = fab.spawn(host, [PY, "-m", "testbed.probe", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode().strip() if ready else ""
    if line != "ready":
        proc.kill()
        err = proc.stderr.read1().decode() if proc.stderr else ""
        raise RuntimeError(f"probe {argv[0]} in {host} did not start: {line!r} {err!r}")
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


def finish(proc: subprocess.Popen, timeout: float = 30.0) -> dict:
    """Wait for a server that ends by itself (sink, tcp-sink) and return its JSON report."""
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.decode().splitlines() if line.strip() and line.strip() != "ready"]
    if not lines:
        raise RuntimeError(f"no report from the probe server: {err.decode()!r}")
    return json.loads(lines[-1])


def probe(fab: Fabric, src_nic: str, dst_nics: list[str] | str, *, count: int = 100, flows: int = 10,
          echo: bool = True, port: int = 7000, interval: float = 0.0005, timeout: float = 0.5,
          sport_base: int = 0, size: int = 64) -> dict | list[dict]:
    """Send UDP from a NIC's address to other NICs; one result per destination (a list when a list
    was given): sent, and with `echo` received, lost, flows_answered, rtt_us, per_flow."""
    dsts = [dst_nics] if isinstance(dst_nics, str) else dst_nics
    argv = [PY, "-m", "testbed.probe", "send", "--src", fab.nic_address(src_nic), "--port", str(port),
            "--count", str(count), "--flows", str(flows), "--interval", str(interval), "--timeout", str(timeout),
            "--size", str(size)]
    if sport_base:
        argv += ["--sport-base", str(sport_base)]
    for d in dsts:
        argv += ["--dst", fab.nic_address(d)]
    if echo:
        argv.append("--echo")
    proc = fab.exec(fab.topology.nic(src_nic).host, argv, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"probe from {src_nic} failed: {proc.stderr.strip()}")
    out = json.loads(proc.stdout)
    results = out.get("results", [out])
    return results[0] if isinstance(dst_nics, str) else results


def tcp_throughput(fab: Fabric, src_nic: str, dst_nic: str, seconds: float = 2.0, port: int = 7002) -> float:
    """Mbit/s of one TCP stream from one NIC to another, measured at the receiver."""
    dst_host = fab.topology.nic(dst_nic).host
    sink = start_server(fab, dst_host, ["tcp-sink", "--bind", fab.nic_address(dst_nic), "--port", str(port)])
    try:
        sender = fab.exec(fab.topology.nic(src_nic).host,
                          [PY, "-m", "testbed.probe", "tcp-send", "--src", fab.nic_address(src_nic),
                           "--dst", fab.nic_address(dst_nic), "--port", str(port), "--seconds", str(seconds)],
                          timeout=seconds + 60)
        if sender.returncode != 0:
            raise RuntimeError(f"tcp-send failed: {sender.stderr.strip()}")
        return float(finish(sink, timeout=30)["mbit_s"] or 0.0)
    finally:
        if sink.poll() is None:
            stop(sink)


def tx(fab: Fabric, link_id: str) -> dict[str, int]:
    """Packets sent so far by each end of a link: {"a": n, "b": n}."""
    c = fab.link_counters(link_id)
    return {"a": c["a"]["tx_packets"], "b": c["b"]["tx_packets"]}
