"""Fixtures for the agent tests.

``console`` is the console the daemon tests talk to. Today it is the fake in
``fake_console.py``; the lead can later point the same tests at the real
console by returning an object with the same interface:

    url                                    base URL
    create_token(cluster_id=7, expires_in_s=3600, max_uses=None) -> "lse_..."
    revoke_token(token), expire_token(token)
    add_node(cluster_id, hostname, machine_id="", state="ready") -> node id
    revoke_credential(node_id), retire(node_id)
    enqueue(node_id, type, args=None, timeout_s=60) -> command id
    redeliver(command_id)                  end the command's lease now
    command(command_id) -> .state .attempt .deliveries .status .result .error .result_posts
    telemetry_records(node_id), telemetry_batches(node_id) -> [{"seq","dropped","count"}], dropped(node_id)
    heartbeats(node_id), inventory(node_id), node(node_id), node_by_name(name)
    requests(path_regex) -> [(time, method, path, status)]
    inject(path_regex, mode, times=1)      "drop_before" | "drop_after" | status code; clear_faults()
    stop(), start()                        the console goes away and comes back on the same URL

``real_console`` is that object for the real console (``real_console.RealConsole``): a uvicorn
process on the test database, stopped and restarted on the same port and database;
``test_agent_real_console.py`` runs the daemon tests that matter against it.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

import pytest
from agent_testlib import PYTHON, REPO, agent_config, subprocess_env
from fake_console import FakeConsole

from agent import log as agentlog
from agent import telemetry
from agent.activities import ActivityRegistry, default_activities
from agent.commands import Registry, load_modules
from agent.daemon import Daemon

# The recorded sysfs trees are full of symlinks back up the tree (device -> ..), as in /sys:
# never walk into them looking for tests.
collect_ignore = ["data"]


@pytest.fixture
def console():
    fake = FakeConsole(heartbeat_interval_s=0.5, poll_wait_s=1).start()
    yield fake
    fake.stop()


@pytest.fixture
def real_console(transactional_db, tmp_path):
    from real_console import RealConsole

    console = RealConsole(tmp_path).start()
    yield console
    console.stop()


@pytest.fixture
def registry() -> Registry:
    """A registry with the built-in commands and the test commands."""
    import agent_test_commands

    load_modules()
    reg = Registry()
    from agent.commands import default_registry

    for name in ("inventory.refresh", "node.health", "activity.set"):
        reg.add(default_registry.get(name))
    return agent_test_commands.register(reg)


@pytest.fixture
def activities() -> ActivityRegistry:
    """The built-in activities and the test ones."""
    import agent_test_commands

    load_modules()
    reg = ActivityRegistry()
    for name in default_activities.names():
        if not name.startswith("test."):
            reg.add(default_activities.get(name))
    return agent_test_commands.register_activities(reg)


class RunningDaemon:
    def __init__(self, daemon: Daemon):
        self.daemon = daemon
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.exit_code = self.daemon.run(install_signals=False)

    def stop(self, timeout: float = 15.0) -> int | None:
        self.daemon.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "daemon did not stop"
        # In a process the loops die with it; here, let an in-flight long poll end so that it
        # cannot claim commands for a stopped agent.
        if self.daemon.supervisor is not None:
            for loop in self.daemon.supervisor.threads():
                loop.join(timeout)
        return self.exit_code


@pytest.fixture
def start_daemon(registry, activities, tmp_path):
    """start_daemon(console, state_dir=None, nvml=None, **config_keys) -> RunningDaemon (in this process)."""
    started: list[RunningDaemon] = []
    agentlog.setup("debug")

    def start(console, state_dir: Path | None = None, nvml=None, wait_ready: bool = True, **keys) -> RunningDaemon:
        keys.setdefault("backoff_max_s", "0.5")
        keys.setdefault("health_interval_s", "3600")
        keys.setdefault("hostname", "node-a")
        keys.setdefault("machine_id", "machine-a")
        keys.setdefault("shutdown_grace_s", "1")
        config = agent_config(state_dir or tmp_path / "state", console.url if console else None, **keys)
        running = RunningDaemon(Daemon(config, registry=registry, nvml=nvml, activities=activities))
        running.thread.start()
        started.append(running)
        if wait_ready:
            assert running.daemon.ready.wait(15), "daemon did not become ready"
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()
    telemetry.set_sink(None)


@pytest.fixture
def agent_process(tmp_path):
    """agent_process(*args, **env_keys) -> Popen of `python -m agent ...` (stdout/stderr to files)."""
    procs: list[subprocess.Popen] = []
    empty_config = tmp_path / "agent.env"
    empty_config.write_text("# test: no settings from /etc/lockstep\n")

    def start(*args: str, **keys: str) -> subprocess.Popen:
        args_list = list(args)
        if args_list and args_list[0] in ("run", "inventory", "enroll") and "--config" not in args_list:
            args_list += ["--config", str(empty_config)]
        log = tmp_path / f"agent-{len(procs)}.log"
        proc = subprocess.Popen(
            [PYTHON, "-m", "agent", *args_list],
            cwd=REPO,
            env=subprocess_env(**keys),
            stdout=subprocess.PIPE,
            stderr=open(log, "w"),  # noqa: SIM115 - closed with the process
            text=True,
        )
        proc.log_path = log  # type: ignore[attr-defined]
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
