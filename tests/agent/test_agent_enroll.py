"""Enrollment: the CLI contract (exit codes, messages, the stored credential)."""

from __future__ import annotations

import json
import stat
import tempfile
from pathlib import Path

import pytest

from agent.cli import main

pytestmark = pytest.mark.timeout(60)


TOKENS = Path(tempfile.mkdtemp(prefix="lsa-tokens-"))


def token_file(directory: Path, token: str) -> str:
    """The token in a file (0600), as an operator hands it over: never in a command line."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"token-{abs(hash(token))}"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


def enroll(capsys, console_url: str, token: str, state, *extra: str) -> tuple[int, str, str]:
    code = main(["enroll", "--console", console_url, "--token-file", token_file(TOKENS, token),
                 "--state-dir", str(state), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(autouse=True)
def no_host_config(monkeypatch, tmp_path):
    # keep the machine's /etc/lockstep/agent.env and LOCKSTEP_ variables out of these tests
    import agent.config

    monkeypatch.setattr(agent.config, "DEFAULT_CONFIG_FILE", str(tmp_path / "none.env"))
    for key in list(__import__("os").environ):
        if key.startswith("LOCKSTEP_"):
            monkeypatch.delenv(key)


def test_enroll_stores_a_root_only_credential(console, tmp_path, capsys):
    token = console.create_token(cluster_id=7)
    state = tmp_path / "state"
    code, out, err = enroll(capsys, console.url, token, state, "--cluster", "7",
                            "--hostname", "node000", "--machine-id", "m-000")
    assert code == 0, err
    assert len(out.strip().splitlines()) == 1
    assert out.startswith("Enrolled node000 as node ") and "python -m agent run" in out
    path = state / "credential.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    node = console.node_by_name("node000")
    assert stored["credential"] == node.credential and stored["credential"].startswith("lsn_")
    assert (stored["node_id"], stored["cluster_id"], stored["console_url"]) == (node.id, 7, console.url)
    assert node.machine_id == "m-000" and node.host["agent_version"] == "0.1.0"
    assert node.host["kernel"] and node.host["cpu_count"]

    # enrolling again (re-running the installer) re-enrolls the same node with a new credential
    code, _, _ = enroll(capsys, console.url, console.create_token(), state,
                        "--hostname", "node000", "--machine-id", "m-000")
    assert code == 0
    again = json.loads(path.read_text())
    assert again["node_id"] == node.id and again["credential"] != stored["credential"]
    assert stored["credential"] not in console.credentials  # the old one is revoked


def _refused(console, kind: str, capsys, tmp_path) -> tuple[str, list[str]]:
    token = console.create_token(cluster_id=7)
    if kind == "invalid":
        return "lse_AAAAAAAAAAAA.not-a-real-secret", []
    if kind == "expired":
        console.expire_token(token)
    elif kind == "revoked":
        console.revoke_token(token)
    elif kind == "exhausted":
        token = console.create_token(cluster_id=7, max_uses=1)
        used = enroll(capsys, console.url, token, tmp_path / "other", "--hostname", "other", "--machine-id", "mo")
        assert used[0] == 0
    elif kind == "wrong_cluster":
        return token, ["--cluster", "8"]
    return token, []


@pytest.mark.parametrize(
    ("kind", "code", "phrases"),
    [
        ("invalid", 4, ["enrollment_token_invalid", "Copy the install line again"]),
        ("expired", 4, ["enrollment_token_expired", "Create a new enrollment token"]),
        ("revoked", 4, ["enrollment_token_revoked", "new enrollment token"]),
        ("exhausted", 4, ["enrollment_token_exhausted", "raise its use limit"]),
        ("wrong_cluster", 4, ["enrollment_token_wrong_cluster", "leave out --cluster"]),
    ],
)
def test_refused_tokens(console, tmp_path, capsys, kind, code, phrases):
    token, extra = _refused(console, kind, capsys, tmp_path)
    state = tmp_path / "state"
    got, out, err = enroll(capsys, console.url, token, state, "--hostname", "n1", "--machine-id", "m1", *extra)
    assert got == code
    assert out == ""
    for phrase in phrases:
        assert phrase in err
    assert not (state / "credential.json").exists()
    assert console.node_by_name("n1") is None  # a refused enrollment changes nothing


def test_hostname_taken_is_a_conflict(console, tmp_path, capsys):
    console.add_node(7, "node007", machine_id="another-machine")
    code, _, err = enroll(capsys, console.url, console.create_token(), tmp_path / "s",
                          "--hostname", "node007", "--machine-id", "this-machine")
    assert code == 5
    assert "hostname_taken" in err and "--hostname" in err and "retire the other node" in err


def test_a_waiting_node_of_an_imported_topology_is_claimed(console, tmp_path, capsys):
    waiting = console.add_node(7, "node010", machine_id="", state="enrolling")
    code, _, err = enroll(capsys, console.url, console.create_token(), tmp_path / "s",
                          "--hostname", "node010", "--machine-id", "m-010")
    assert code == 0, err
    assert json.loads((tmp_path / "s" / "credential.json").read_text())["node_id"] == waiting


def test_unreachable_console(console, tmp_path, capsys):
    token = console.create_token()
    console.stop()
    code, _, err = enroll(capsys, console.url, token, tmp_path / "s", "--hostname", "n", "--machine-id", "m")
    assert code == 3
    assert f"Cannot reach the console at {console.url}" in err and "firewall" in err


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (["--console", "ftp://x", "TOKEN", "lse_AbCdEfGhIjKl.s"], "--console='ftp://x' is not a console URL"),
        (["--console", "http://127.0.0.1:9", "TOKEN", "lst_AbCdEfGhIjKl.s"], "is not an enrollment token"),
        (["--console", "http://127.0.0.1:9"], "enroll needs an enrollment token: --token-file FILE"),
        (["TOKEN", "lse_AbCdEfGhIjKl.s"], "enroll needs --console"),
        (["--console", "http://127.0.0.1:9", "TOKEN", "lse_AbCdEfGhIjKl.s", "--hostname", "a b"],
         "--hostname='a b' is not a valid host name"),
        (["--console", "http://127.0.0.1:9", "TOKEN", "lse_AbCdEfGhIjKl.s", "--cluster", "x"], "invalid int value"),
        # Issue 9, finding 1: a token in the command line is readable by every user of the node.
        (["--console", "http://127.0.0.1:9", "--token", "lse_AbCdEfGhIjKl.s"], "--token is not accepted"),
        (["--console", "http://127.0.0.1:9", "--token-file", "/nonexistent/t"], "cannot be read"),
    ],
)
def test_usage_errors_exit_2(tmp_path, capsys, argv, phrase):
    if "TOKEN" in argv:  # the token goes in a file
        at = argv.index("TOKEN")
        argv = [*argv[:at], "--token-file", token_file(tmp_path / "tokens", argv[at + 1]), *argv[at + 2:]]
    with pytest.raises(SystemExit) as info:
        code = main(["enroll", "--state-dir", str(tmp_path / "s"), *argv])
        raise SystemExit(code)
    assert info.value.code == 2
    assert phrase in capsys.readouterr().err


def test_credential_cannot_be_stored(console, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, _, err = enroll(capsys, console.url, console.create_token(), blocker / "state",
                          "--hostname", "n2", "--machine-id", "m2")
    assert code == 6 and "could not be stored" in err and "enroll again" in err


def test_the_token_can_come_on_standard_input(console, tmp_path, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(console.create_token() + "\n"))
    code = main(["enroll", "--console", console.url, "--token-file", "-", "--state-dir", str(tmp_path / "state"),
                 "--hostname", "node-stdin", "--machine-id", "m-stdin"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "state" / "credential.json").exists()


def test_re_enrolling_sends_the_held_credential_and_a_fresh_state_is_refused(real_console, tmp_path, capsys):
    console = real_console
    token = console.create_token(max_uses=5)
    state = tmp_path / "state"
    assert enroll(capsys, console.url, token, state, "--hostname", "node-re", "--machine-id", "m-re")[0] == 0
    held = json.loads((state / "credential.json").read_text())["credential"]
    # The same node again: its credential proves it, and it gets a new one.
    assert enroll(capsys, console.url, token, state, "--hostname", "node-re", "--machine-id", "m-re")[0] == 0
    assert json.loads((state / "credential.json").read_text())["credential"] != held
    # Another machine claiming the same machine id with the token alone: exit 5, it says what to do.
    code, _, err = enroll(capsys, console.url, token, tmp_path / "other", "--hostname", "node-re", "--machine-id", "m-re")
    assert code == 5 and "node_already_enrolled" in err and "reset the node's credential" in err
