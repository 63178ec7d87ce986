"""The demo's cluster, with a fault injected now and then so a newcomer sees the console react.

`EmulatedDemo` (root and network namespaces): real agents on an emulated fabric; a frozen host
turns lost, a downed NIC turns red, both heal. `SimulatedDemo` (anywhere else): the simulated
fleet's lightweight agents speak the real protocol for the same hosts; a paused agent's node turns
lost, then ready again.

The console side (organization, cluster, topology, enrollment token) is prepared by
`manage.py demo`; this module only drives agents and faults, so it needs no Django.
"""

from __future__ import annotations

import abc
import logging
import random
import threading
import time
import urllib.request
from collections.abc import Callable

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


class Demo(abc.ABC):
    """Wait for the console, start the agents, then inject a fault every so often until stopped."""

    supported_faults: tuple[str, ...] = FAULT_KINDS

    def __init__(self, topology: dict, *, fault_every_s: float = 45.0, fault_for_s: float = 40.0,
                 faults: tuple[str, ...] = FAULT_KINDS, seed: int | None = None) -> None:
        unknown = set(faults) - set(self.supported_faults)
        if unknown or not faults:
            raise ValueError(f"fault kinds must be some of {', '.join(self.supported_faults)}; "
                             f"got {', '.join(faults) or 'none'}")
        self.topology, self.faults = topology, tuple(faults)
        self.fault_every_s, self.fault_for_s = fault_every_s, fault_for_s
        self.random = random.Random(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def up(self) -> str | None:
        """Prepare; returns another address the console must listen on, if any."""
        return None

    def start(self, port: int, token: str, cluster_id: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(port, token, cluster_id), name="demo-driver",
                                        daemon=True)
        self._thread.start()

    def _run(self, port: int, token: str, cluster_id: int) -> None:
        deadline = time.monotonic() + 60
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):  # noqa: S310
                    break
            except OSError:
                self._stop.wait(0.5)
        self.start_agents(port, token, cluster_id)
        while not self._stop.wait(self.fault_every_s):
            heal = self.inject(self.random.choice(self.faults))
            if not self._stop.wait(self.fault_for_s):
                heal()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        self.tear_down()

    @abc.abstractmethod
    def start_agents(self, port: int, token: str, cluster_id: int) -> None:
        """Start one agent per host of the topology against the console on `port`."""

    @abc.abstractmethod
    def inject(self, kind: str) -> Callable[[], None]:
        """Inject one fault of `kind`, log it, and return what heals it."""

    @abc.abstractmethod
    def tear_down(self) -> None:
        """Stop the agents and remove whatever `up` built."""


class EmulatedDemo(Demo):
    """An emulated fabric in network namespaces with a real agent per host."""

    def __init__(self, topology: dict, *, prefix: str = PREFIX, **kwargs) -> None:
        super().__init__(topology, **kwargs)
        self.prefix = prefix
        self.fabric: Fabric | None = None

    @staticmethod
    def unavailable_reason() -> str | None:
        return netns_problem()

    def up(self) -> str:
        Fabric.down_all(prefixes=[self.prefix])  # leftovers of a demo that was killed
        self.fabric = Fabric.up(self.topology, prefix=self.prefix)
        return self.fabric.bridge_address

    def start_agents(self, port: int, token: str, cluster_id: int) -> None:
        url = self.fabric.console_url(port)
        self.fabric.start_agents(console_url=url, token=token, cluster_id=cluster_id, env=AGENT_ENV)
        log.info("demo: %d agents started against %s", len(self.fabric.agents()), url)

    def inject(self, kind: str) -> Callable[[], None]:
        if kind == "host-stall":
            host = self.random.choice([h["name"] for h in self.topology["hosts"]])
            fault = self.fabric.fault_host_stall(host)
            log.info("demo: froze host %s for %.0fs: its node turns lost, then ready again", host, self.fault_for_s)
        else:
            nic = self.random.choice([n["name"] for n in self.topology["nics"]])
            fault = self.fabric.fault_nic_down(nic)
            log.info("demo: took NIC %s down for %.0fs: it turns red on the map, then green", nic, self.fault_for_s)

        def heal() -> None:
            self.fabric.heal(fault)
            log.info("demo: healed %s", fault)

        return heal

    def tear_down(self) -> None:
        if self.fabric:
            try:
                self.fabric.heal_all()
                self.fabric.stop_agents()
            finally:
                self.fabric.down()


class SimulatedDemo(Demo):
    """The simulated fleet (testbed.fleet) standing in for the hosts, when namespaces are unavailable."""

    supported_faults = ("host-stall",)

    def __init__(self, topology: dict, **kwargs) -> None:
        kwargs["faults"] = tuple(f for f in kwargs.get("faults", FAULT_KINDS) if f in self.supported_faults)
        super().__init__(topology, **kwargs)
        self.fleet = None

    def start_agents(self, port: int, token: str, cluster_id: int) -> None:
        from testbed.fleet import BackgroundFleet, FleetConfig

        hosts = [h["name"] for h in self.topology["hosts"]]
        rails = max((n.get("rail", 0) for n in self.topology["nics"]), default=0) + 1
        self.fleet = BackgroundFleet(FleetConfig(
            console=f"http://127.0.0.1:{port}", token=token, agents=len(hosts), cluster_id=cluster_id,
            names=hosts, rails=rails, telemetry_every_s=60.0,
        )).__enter__()
        log.info("demo: %d simulated agents started against http://127.0.0.1:%d", len(hosts), port)

    def inject(self, kind: str) -> Callable[[], None]:
        host = self.random.choice([h["name"] for h in self.topology["hosts"]])
        self.fleet.call(lambda fleet: fleet.pause(host))
        log.info("demo: froze host %s for %.0fs: its node turns lost, then ready again", host, self.fault_for_s)

        def heal() -> None:
            self.fleet.call(lambda fleet: fleet.resume(host))
            log.info("demo: resumed %s", host)

        return heal

    def tear_down(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
