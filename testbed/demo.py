"""The demo's cluster: real agents on an emulated fabric, with a fault injected now and then so
a newcomer sees the console react (a frozen host turns lost, a downed NIC turns red, both heal).

The console side (organization, cluster, topology, enrollment token) is prepared by
`manage.py demo`; this module only drives the testbed, so it needs no Django.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import urllib.request

from testbed.fabric import Fabric
from testbed.netops import netns_problem

log = logging.getLogger("lockstep.demo")
PREFIX = "demo"
FAULT_KINDS = ("host-stall", "nic-down")

# What the agents in the demo are told: talk often, so faults show within seconds.
AGENT_ENV = {
    "LOCKSTEP_INVENTORY_INTERVAL_S": "10",
    "LOCKSTEP_HEALTH_INTERVAL_S": "15",
    "LOCKSTEP_LOG_LEVEL": "info",
}


class EmulatedDemo:
    """An emulated fabric with an agent per host and a fault loop on a thread."""

    def __init__(self, topology: dict, *, prefix: str = PREFIX, fault_every_s: float = 45.0,
                 fault_for_s: float = 40.0, faults: tuple[str, ...] = FAULT_KINDS, seed: int | None = None) -> None:
        unknown = set(faults) - set(FAULT_KINDS)
        if unknown or not faults:
            raise ValueError(f"fault kinds must be some of {', '.join(FAULT_KINDS)}; got {', '.join(faults) or 'none'}")
        self.topology, self.prefix, self.faults = topology, prefix, tuple(faults)
        self.fault_every_s, self.fault_for_s = fault_every_s, fault_for_s
        self.random = random.Random(seed)
        self.fabric: Fabric | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def unavailable_reason() -> str | None:
        return netns_problem()

    def up(self) -> str:
        """Build the fabric; returns the address the console must also listen on."""
        Fabric.down_all(prefixes=[self.prefix])  # leftovers of a demo that was killed
        self.fabric = Fabric.up(self.topology, prefix=self.prefix)
        return self.fabric.bridge_address

    def start(self, port: int, token: str, cluster_id: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(port, token, cluster_id), name="demo-driver",
                                        daemon=True)
        self._thread.start()

    def _run(self, port: int, token: str, cluster_id: int) -> None:
        fabric = self.fabric
        url = fabric.console_url(port)
        deadline = time.monotonic() + 60
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):  # noqa: S310
                    break
            except OSError:
                self._stop.wait(0.5)
        fabric.start_agents(console_url=url, token=token, cluster_id=cluster_id, env=AGENT_ENV)
        log.info("demo: %d agents started against %s", len(fabric.agents()), url)
        while not self._stop.wait(self.fault_every_s):
            self._one_fault()

    def _one_fault(self) -> None:
        fabric = self.fabric
        hosts = [h["name"] for h in self.topology["hosts"]]
        nics = [n["name"] for n in self.topology["nics"]]
        if self.random.choice(self.faults) == "host-stall":
            host = self.random.choice(hosts)
            fault = fabric.fault_host_stall(host)
            log.info("demo: froze host %s for %.0fs: its node turns lost, then ready again", host, self.fault_for_s)
        else:
            nic = self.random.choice(nics)
            fault = fabric.fault_nic_down(nic)
            log.info("demo: took NIC %s down for %.0fs: it turns red on the map, then green", nic, self.fault_for_s)
        if not self._stop.wait(self.fault_for_s):
            fabric.heal(fault)
            log.info("demo: healed %s", fault)

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        if self.fabric:
            try:
                self.fabric.heal_all()
                self.fabric.stop_agents()
            finally:
                self.fabric.down()
