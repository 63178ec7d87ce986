"""Node agents in the host namespaces of an emulated fabric: start, stop, restart, freeze, thaw.

Each host gets its own agent process started as
``ip netns exec <ns> <argv>`` (default argv: ``<python> -m agent run``, from the repository
root) with the agent's environment contract:

    LOCKSTEP_CONSOLE_URL   the console, reached over the management network
    LOCKSTEP_STATE_DIR     <state dir>/agents/<host>/state (mode 0700, kept across restarts)
    LOCKSTEP_HOSTNAME      the topology host name
    LOCKSTEP_MACHINE_ID    uuid5 of "lockstep-testbed:<prefix>:<host>" (stable across runs)
    LOCKSTEP_ENROLL_TOKEN  the enrollment token
    LOCKSTEP_CLUSTER_ID    the cluster id (when given)
    LOCKSTEP_AGENT_SOCKET  <state dir>/agents/<host>/state/agent.sock (hosts share the file system)

Argv items may use ``{python}``, ``{repo}``, ``{host}``, ``{ns}``, ``{state_dir}``,
``{mgmt_address}`` and ``{console_url}``, so a test can start a stand-in until the agent lands.
Output goes to <state dir>/agents/<host>/agent.log. Each agent runs in its own cgroup
(``<host ns>/agent``): freezing it freezes its children too; `down` kills them all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

from . import procs
from .netops import TestbedError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_AGENT_ARGV = ("{python}", "-m", "agent", "run")
MACHINE_ID_NAMESPACE = uuid.UUID("6c0c5f0e-8f6e-4a41-9d3c-6c6f636b7374")


def machine_id(prefix: str, host: str) -> str:
    return uuid.uuid5(MACHINE_ID_NAMESPACE, f"lockstep-testbed:{prefix}:{host}").hex


class AgentsMixin:
    """Agent management methods of `Fabric`."""

    def _agent_dir(self, host: str) -> Path:
        return self.state_dir / "agents" / host

    def _agent_hosts(self, hosts: Iterable[str] | None) -> list[str]:
        if hosts is None:
            return list(self.plan.hosts)
        hosts = list(hosts)
        for h in hosts:
            self._host(h)
        return hosts

    def start_agents(self, console_url: str | None = None, token: str = "", cluster_id: int | str | None = None,
                     argv: Sequence[str] | None = None, hosts: Iterable[str] | None = None,
                     env: dict[str, str] | None = None) -> dict[str, int]:
        """Start an agent in every host (or `hosts`); returns {host: pid}.

        The configuration is remembered, so `restart_agents` and `start_agents()` without
        arguments reuse it. Hosts whose agent already runs are left alone.
        """
        with self._mutate() as st:
            previous = st.get("agent_config")
            if console_url is not None or not previous:
                config = {"console_url": console_url or self.console_url(), "token": token,
                          "cluster_id": cluster_id, "argv": list(argv or DEFAULT_AGENT_ARGV), "env": dict(env or {})}
            else:  # reuse the remembered configuration, overriding what was given
                config = dict(previous)
                if token:
                    config["token"] = token
                if cluster_id is not None:
                    config["cluster_id"] = cluster_id
                if argv is not None:
                    config["argv"] = list(argv)
                if env is not None:
                    config["env"] = dict(env)
            st["agent_config"] = config
            started = {}
            for host in self._agent_hosts(hosts):
                record = st["agents"].get(host)
                if record and procs.alive(record["pid"], record["start"]):
                    continue
                st["agents"][host] = self._spawn_agent(host, config)
                started[host] = st["agents"][host]["pid"]
            return started

    def _spawn_agent(self, host: str, config: dict) -> dict:
        h = self._host(host)
        adir = self._agent_dir(host)
        state_dir = adir / "state"
        state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(state_dir, 0o700)
        subst = {"python": sys.executable, "repo": str(REPO_ROOT), "host": host, "ns": h.ns,
                 "state_dir": str(state_dir), "mgmt_address": h.mgmt_address,
                 "console_url": config["console_url"]}
        try:
            argv = [str(a).format(**subst) for a in config["argv"]]
        except (KeyError, IndexError, ValueError) as exc:
            raise TestbedError(f"agent command {config['argv']!r}: bad placeholder ({exc}); "
                               f"use {', '.join('{' + k + '}' for k in subst)}") from exc
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": str(state_dir),
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(REPO_ROOT),
            "LOCKSTEP_CONSOLE_URL": config["console_url"],
            "LOCKSTEP_STATE_DIR": str(state_dir),
            "LOCKSTEP_HOSTNAME": host,
            "LOCKSTEP_MACHINE_ID": machine_id(self.prefix, host),
            "LOCKSTEP_ENROLL_TOKEN": config.get("token") or "",
            # Every emulated host shares this machine's file system: one local socket per agent.
            "LOCKSTEP_AGENT_SOCKET": str(state_dir / "agent.sock"),
        }
        if config.get("cluster_id") is not None:
            env["LOCKSTEP_CLUSTER_ID"] = str(config["cluster_id"])
        env |= config.get("env") or {}
        cgroup = self.cgroups.ensure(h.ns, "agent") if self.cgroups.available else None
        log = adir / "agent.log"
        with open(log, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} start: {' '.join(argv)}\n".encode())
            out.flush()
            proc = procs.spawn(["ip", "netns", "exec", h.ns, *argv], cgroup=cgroup, env=env, cwd=str(REPO_ROOT),
                               stdout=out, stderr=out)
        start = None
        deadline = time.monotonic() + 5
        while start is None and time.monotonic() < deadline:
            start = procs.start_time(proc.pid)
        return {"pid": proc.pid, "start": start, "argv": argv, "log": str(log), "state_dir": str(state_dir),
                "started": time.time(), "machine_id": env["LOCKSTEP_MACHINE_ID"]}

    def stop_agents(self, hosts: Iterable[str] | None = None, timeout: float = 5.0) -> list[str]:
        """SIGTERM each agent (thawing it first), SIGKILL after `timeout`, kill its children."""
        stopped = []
        with self._mutate() as st:
            targets = self._agent_hosts(hosts)
            waiting = []
            for host in targets:
                record = st["agents"].get(host)
                if not record:
                    continue
                ns = self.plan.hosts[host].ns
                if self.cgroups.available:
                    self.cgroups.set_frozen(False, ns, "agent")
                procs.signal_if_same(record["pid"], record["start"], signal.SIGCONT)
                if procs.signal_if_same(record["pid"], record["start"], signal.SIGTERM):
                    waiting.append((host, record))
            deadline = time.monotonic() + timeout
            for _host, record in waiting:
                procs.wait_gone([(record["pid"], record["start"])], max(0.0, deadline - time.monotonic()))
                procs.signal_if_same(record["pid"], record["start"], signal.SIGKILL)
            for host in targets:
                if host in st["agents"]:
                    ns = self.plan.hosts[host].ns
                    if self.cgroups.available:
                        self.cgroups.kill(ns, "agent")
                    record = st["agents"].pop(host)
                    procs.wait_gone([(record["pid"], record["start"])], 2.0)
                    stopped.append(host)
        return stopped

    def restart_agents(self, hosts: Iterable[str] | None = None) -> dict[str, int]:
        if not (self.refresh().state.get("agent_config")):
            raise TestbedError("no agent configuration yet; start agents first (console URL, token)")
        targets = self._agent_hosts(hosts)
        self.stop_agents(targets)
        return self.start_agents(hosts=targets)

    def _set_agents_frozen(self, hosts: Iterable[str] | None, frozen: bool) -> list[str]:
        self.refresh()
        done = []
        for host in self._agent_hosts(hosts):
            record = self.state["agents"].get(host)
            if not record or not procs.alive(record["pid"], record["start"]):
                continue
            ns = self.plan.hosts[host].ns
            sig = signal.SIGSTOP if frozen else signal.SIGCONT
            via_cgroup = self.cgroups.available and self.cgroups.set_frozen(frozen, ns, "agent")
            if via_cgroup or procs.signal_if_same(record["pid"], record["start"], sig):
                done.append(host)
        return done

    def freeze_agents(self, hosts: Iterable[str] | None = None) -> list[str]:
        """Freeze agents (and their children) without stopping them; `thaw_agents` resumes them."""
        return self._set_agents_frozen(hosts, True)

    def thaw_agents(self, hosts: Iterable[str] | None = None) -> list[str]:
        return self._set_agents_frozen(hosts, False)

    def agents(self) -> dict[str, dict]:
        """{host: {pid, running, frozen, log, state_dir, machine_id}} for every agent started."""
        out = {}
        for host, record in (self.state.get("agents") or {}).items():
            running = procs.alive(record["pid"], record["start"])
            ns = self.plan.hosts[host].ns if host in self.plan.hosts else None
            frozen = False
            if running:
                with contextlib.suppress(OSError):
                    frozen = (self.cgroups.available and ns is not None
                              and (self.cgroups.frozen(ns, "agent") or self.cgroups.frozen(ns))) \
                        or procs.state(record["pid"]) == "T"
            out[host] = {"pid": record["pid"], "running": running, "frozen": bool(frozen), "log": record["log"],
                         "state_dir": record["state_dir"], "machine_id": record.get("machine_id")}
        return out
