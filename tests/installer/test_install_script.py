"""install.sh on this machine, without a node namespace: shellcheck, truncation, host checks,
usage errors, the lock, a refused download, the systemd path (with a recording systemctl) and
the supervisor."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from console.agentdist.installer import INSTALL_DIR, render_install_script
from tests.factories import make_enrollment_token
from tests.installer.conftest import needs_root
from tests.installer.installer_lib import (
    CLEAN_PATH,
    Result,
    alive,
    leftovers,
    python_args,
    run,
    snapshot,
    token_file,
    wait_gone,
)
from tests.integration.conftest import wait_until

NOWHERE = "http://127.0.0.1:9"
TOKEN = "lse_AAAAAAAAAAAA.secret-of-no-token"


@pytest.fixture
def script(agent_package) -> str:
    return render_install_script(NOWHERE, agent_package)


def sh(script: str, *args: str, path: str = CLEAN_PATH, prefix: tuple[str, ...] = ()) -> Result:
    """Run the script as `curl ... | sh -s -- ARGS` does: read from standard input."""
    return run([*prefix, "sh", "-s", "--", *args], input=script, env={"PATH": path, "LANG": "C.UTF-8"})


def stub(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


# --- shellcheck -------------------------------------------------------------------------------

SHELLCHECK = shutil.which("shellcheck")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (Debian: apt-get install shellcheck)")
def test_the_served_script_and_its_pieces_are_shellcheck_clean(script, tmp_path):
    served = tmp_path / "install.sh"
    served.write_text(script)
    paths = [served, INSTALL_DIR / "install.sh.in", INSTALL_DIR / "supervise.sh"]
    result = subprocess.run([SHELLCHECK, "-s", "sh", "-S", "style", *map(str, paths)], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_script_is_one_function_called_on_its_last_line(script):
    lines = script.splitlines()
    opening = lines.index("main() {")
    closing = len(lines) - 1 - lines[::-1].index("}")
    assert all(ln.startswith("#") or not ln.strip() for ln in lines[:opening]), "a command before main()"
    assert [ln for ln in lines[closing + 1 :] if ln.strip()] == ['{ main "$@"; }']
    assert lines[opening + 1].strip() == "set -eu"


# --- truncation -------------------------------------------------------------------------------


@needs_root
def test_a_truncated_download_runs_nothing(script, install_root):
    args = (*token_file(TOKEN), "--root", str(install_root), "--dry-run")
    full = sh(script, *args)
    assert "lockstep: dry run" in full.out, full  # the whole script does act
    last = script.rindex('{ main "$@"; }')
    # anywhere in the body, and at every character of the last line: never a run
    cuts = [200, len(script) // 4, len(script) // 2, len(script) * 3 // 4, last - 3, *range(last, len(script) - 1)]
    for cut in cuts:
        result = sh(script[:cut], *args)
        assert "lockstep:" not in result.out + result.err, f"cut at {cut}: {result}"
        assert leftovers(install_root) == [], f"cut at {cut}"
    assert sh(script[:last], *args).rc == 0  # complete up to the call: defines main, runs nothing


# --- host checks and usage --------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize(
    ("system", "machine", "code", "message"),
    [("Darwin", "arm64", 11, "this is Darwin: the Lockstep agent runs on Linux GPU nodes only"),
     ("Linux", "riscv64", 12, "unsupported CPU architecture riscv64")],
)
def test_other_systems_and_architectures_are_refused(script, install_root, tmp_path, system, machine, code,
                                                     message):
    stub(tmp_path / "bin", "uname", f'case "$1" in -s) echo {system} ;; -m) echo {machine} ;; esac\n')
    result = sh(script, *token_file(TOKEN), "--root", str(install_root), path=f"{tmp_path / 'bin'}:{CLEAN_PATH}")
    assert result.rc == code and message in result.err, result
    assert leftovers(install_root) == []


@needs_root
def test_not_root_exits_13(script, install_root):
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    result = sh(script, *token_file(TOKEN), "--root", str(install_root),
                prefix=(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"))
    assert result.rc == 13, result
    assert "must run as root: pipe it to 'sudo sh -s -- ...'" in result.err
    assert leftovers(install_root) == []


@needs_root
def test_python_problems_exit_14_and_15(script, install_root, tmp_path):
    result = sh(script, *token_file(TOKEN), "--root", str(install_root), "--python", "/bin/false")
    assert result.rc == 14 and "is not a Python 3.10 or newer" in result.err, result
    real = shutil.which("python3", path=CLEAN_PATH) or getattr(sys, "_base_executable", sys.executable)
    no_venv = stub(tmp_path / "bin", "python-no-venv",
                   f'for a; do case $a in *"import venv"*) exit 1 ;; esac; done\nexec {real} "$@"\n')
    result = sh(script, *token_file(TOKEN), "--root", str(install_root), "--python", str(no_venv))
    assert result.rc == 15 and "has no venv module: install it (Debian/Ubuntu: apt-get install python3-venv)" \
        in result.err, result
    assert leftovers(install_root) == []


@needs_root
@pytest.mark.parametrize(
    ("args", "message"),
    [(("--bogus",), "unknown option '--bogus'"),
     (("--token", TOKEN), "--token puts the enrollment token in the command line"),
     (("--token=" + TOKEN,), "--token puts the enrollment token in the command line"),
     (("--token-file",), "option --token-file needs a value"),
     (("--token-file", "/nonexistent/token"), "--token-file '/nonexistent/token' is not a readable file"),
     (("--console", "ftp://x"), "is not a console URL"),
     (("--console", "http://x/'$(reboot)'"), "has characters a console URL does not have"),
     (token_file("lse_short.x"), "does not look like an enrollment token"),
     (("--cluster", "seven"), "--cluster 'seven' must be a positive integer"),
     (("--hostname", "a b"), "is not a host name"),
     (("--init", "upstart"), "--init 'upstart' must be auto, systemd or supervisor"),
     (("--root", "relative/dir"), "must be an absolute path"),
     (("--uninstall", *token_file(TOKEN)), "--uninstall takes no --token-file"),
     ((), "the node is not enrolled yet and no enrollment token was given")],
)
def test_usage_errors_exit_10(script, install_root, args, message):
    root_args = () if "--root" in args else ("--root", str(install_root))
    result = sh(script, *root_args, *python_args(), *args)
    assert result.rc == 10 and message in result.err, result
    assert leftovers(install_root) == []


@needs_root
def test_a_second_installer_waits_for_the_first(script, install_root):
    lock = install_root / "run/lockstep/install.lock"
    lock.mkdir(parents=True)
    (lock / "pid").write_text(f"{os.getpid()}\n")  # a live process holds it
    before = snapshot(install_root)
    result = sh(script, *token_file(TOKEN), "--root", str(install_root), *python_args())
    assert result.rc == 17 and f"another run of this installer (pid {os.getpid()}) is in progress" in result.err
    assert snapshot(install_root) == before


@needs_root
@pytest.mark.slow
def test_a_refused_download_exits_21(loopback_console, agent_package, install_root):
    missing = replace(agent_package, filename="lockstep-agent-0.0.0.tar.gz")
    script = render_install_script(loopback_console.url, missing)
    result = sh(script, *token_file(TOKEN), "--root", str(install_root), *python_args())
    assert result.rc == 21, result
    assert "the console refused the download" in result.err and "build_agent_package" in result.err
    assert leftovers(install_root) == []


# --- systemd, with a systemctl that records what it is asked ----------------------------------

SYSTEMCTL = """\
state={state}
echo "$*" >>"$state/calls"
case "$1" in
    is-enabled) [ -f "$state/enabled" ] ;;
    is-active) [ -f "$state/active" ] ;;
    enable) touch "$state/enabled" ;;
    start | restart) touch "$state/active" ;;
    disable) rm -f "$state/enabled" "$state/active" ;;
    *) : ;;
esac
"""


@needs_root
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_with_systemd_the_unit_is_installed_enabled_and_restarted_only_on_change(
    loopback_console, agent_package, install_root, tmp_path, world
):
    from console.fleet.models import Cluster

    state = tmp_path / "systemctl"
    state.mkdir()
    stub(tmp_path / "bin", "systemctl", SYSTEMCTL.format(state=state))
    path = f"{tmp_path / 'bin'}:{CLEAN_PATH}"
    script = render_install_script(loopback_console.url, agent_package)
    token = make_enrollment_token(Cluster.objects.create(organization=world.acme, name="lsi-systemd"))
    args = ("--init", "systemd", "--root", str(install_root), "--hostname", "lsi-systemd-01", *python_args())

    def calls() -> list[str]:
        log = state / "calls"
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return [line for line in lines if not line.startswith("is-")]

    first = sh(script, *token_file(token), *args, path=path)
    assert first.rc == 0, first
    unit = (install_root / "etc/systemd/system/lockstep-agent.service").read_text()
    assert f"ExecStart={install_root}/opt/lockstep/venv/bin/python -m agent run --config " \
           f"{install_root}/etc/lockstep/agent.env" in unit
    for line in ("Restart=always", "RestartPreventExitStatus=2 4 5", "After=network-online.target",
                 "WantedBy=multi-user.target"):
        assert line in unit.splitlines()
    assert calls() == ["daemon-reload", "enable lockstep-agent.service", "restart lockstep-agent.service"]
    assert not (install_root / "opt/lockstep/supervise.sh").exists()
    before = snapshot(install_root)

    again = sh(script, *token_file(token), *args, path=path)
    assert again.rc == 0 and "lockstep-agent.service is running and nothing changed: not restarted" in again.out
    assert calls() == [] and snapshot(install_root) == before

    (state / "active").unlink()  # stopped by someone: started again, nothing rewritten
    started = sh(script, *args, path=path)
    assert started.rc == 0 and calls() == ["start lockstep-agent.service"] and snapshot(install_root) == before

    gone = sh(script, "--uninstall", "--init", "systemd", "--root", str(install_root), path=path)
    assert gone.rc == 0, gone
    assert calls() == ["disable --now lockstep-agent.service", "daemon-reload"]
    assert leftovers(install_root) == []


# --- the supervisor ---------------------------------------------------------------------------


def fake_agent(tmp_path: Path, codes: list[int]) -> Path:
    """A stand-in for the venv's python: each start appends a line and exits with the next code."""
    (tmp_path / "codes").write_text("".join(f"{c}\n" for c in codes))
    return stub(tmp_path, "python", f"""\
echo "$$ $*" >>{tmp_path}/starts
code=$(head -n 1 {tmp_path}/codes)
sed -i 1d {tmp_path}/codes
if [ -z "$code" ]; then
    trap 'exit 0' TERM
    while :; do sleep 1; done
fi
exit "$code"
""")


def start_supervisor(tmp_path: Path, python: Path) -> subprocess.Popen:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = open(tmp_path / "supervisor.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(["sh", str(INSTALL_DIR / "supervise.sh"), str(python), "/etc/lockstep/agent.env",
                             str(run_dir)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_the_supervisor_restarts_the_agent_and_gives_up_on_2_4_5(tmp_path):
    python = fake_agent(tmp_path, [1, 4])
    supervisor = start_supervisor(tmp_path, python)
    assert supervisor.wait(timeout=30) == 4  # restarted after the 1 (5 s later), stopped at the 4
    starts = (tmp_path / "starts").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in starts] == ["-m agent run --config /etc/lockstep/agent.env"] * 2
    log = (tmp_path / "supervisor.log").read_text()
    assert "event=supervisor.restarting status=1 in_s=5" in log and "event=supervisor.gave_up status=4" in log
    assert sorted(os.listdir(tmp_path / "run")) == []


def test_sigterm_stops_the_supervisor_and_its_agent_and_leaves_nothing(tmp_path):
    python = fake_agent(tmp_path, [])  # runs until told to stop
    supervisor = start_supervisor(tmp_path, python)
    agent_pid_file = tmp_path / "run" / "agent.pid"
    agent = wait_until(lambda: agent_pid_file.exists() and int(agent_pid_file.read_text()), 10, "the agent")
    assert int((tmp_path / "run" / "supervisor.pid").read_text()) == supervisor.pid
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=15) == 0
    wait_gone([agent], 10)
    assert sorted(os.listdir(tmp_path / "run")) == []


def test_sigterm_during_the_restart_delay_leaves_no_sleep_behind(tmp_path):
    python = fake_agent(tmp_path, [1])
    supervisor = start_supervisor(tmp_path, python)
    wait_until(lambda: "event=supervisor.restarting" in (tmp_path / "supervisor.log").read_text(), 10,
               "the supervisor to wait before restarting")
    children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children").read_text().split()
    started = time.monotonic()
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(timeout=10) == 0 and time.monotonic() - started < 4
    wait_gone([int(c) for c in children], 5)
    assert not any(alive(int(c)) for c in children)
