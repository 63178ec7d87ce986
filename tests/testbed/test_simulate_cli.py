"""The simulator's command line: every command, its errors, its --help, and the hook that
`python -m testbed simulate` uses."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.simulate import cli

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "data" / "scenarios"


def test_topology_command_writes_the_preset(tmp_path):
    out = tmp_path / "t.json"
    assert cli.main(["topology", "--preset", "example", "--out", str(out)]) == 0
    assert out.read_text() == (SCENARIOS / "ex1-link-loss" / "topology.json").read_text()
    assert cli.main(["topology", "--hosts", "16", "--rails", "2", "--hosts-per-leaf", "4", "--spines", "2",
                     "--links-per-leaf-spine", "1", "--su-per-pod", "2", "--cores-per-plane", "2",
                     "--out", str(tmp_path / "small.json")]) == 0
    doc = json.loads((tmp_path / "small.json").read_text())
    assert doc["name"] == "rail2-h16-su4-s2x1-p2-c2x1"
    assert sum(s["tier"] == "core" for s in doc["switches"]) == 4


def test_window_command_writes_the_three_documents(tmp_path):
    out = tmp_path / "w"
    assert cli.main(["window", "--topology", "example", "--faults", "link_loss:1,switch:1", "--seed", "7",
                     "--out", str(out)]) == 0
    truth = json.loads((out / "truth.json").read_text())
    assert truth["scenario"]["faults_spec"] == "link_loss:1,switch_loss:1"
    assert [c["kind"] for c in truth["culprits"]] == ["link", "switch"]
    assert cli.main(["check", str(out)]) == 0
    # the same window from the topology file: same bytes (parameters come from the name)
    again = tmp_path / "again"
    assert cli.main(["window", "--topology", str(out / "topology.json"), "--faults", "link_loss:1,switch:1",
                     "--seed", "7", "--out", str(again)]) == 0
    for name in ("topology.json", "observations.json", "truth.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes()


def test_window_options_reach_the_scenario(tmp_path):
    out = tmp_path / "w"
    assert cli.main(["window", "--topology", "rail2-h16-su4-s2x1", "--faults", "none", "--out", str(out),
                     "--peers-per-nic", "5", "--peer-mix", "0.2,0.4,0.4", "--sent", "200", "--path-fraction", "0",
                     "--noisy-hosts", "1", "--bg-loss", "0,0", "--window-s", "2"]) == 0
    truth = json.loads((out / "truth.json").read_text())["scenario"]
    obs = json.loads((out / "observations.json").read_text())
    assert truth["peers_per_nic"] == 5 and truth["pairs"] == 32 * 5 and truth["pairs_with_path"] == 0
    assert len(truth["noisy_hosts"]) == 1 and obs["window_s"] == 2.0
    assert {p["sent"] for p in obs["probes"]} == {200} and sum(p["lost"] for p in obs["probes"]) == 0


def test_suite_command(tmp_path):
    out = tmp_path / "suite"
    assert cli.main(["suite", "--out", str(out), "--faults-set", "none", "--faults-set", "host_loss:1",
                     "--seeds", "2"]) == 0
    index = json.loads((out / "suite.json").read_text())
    assert [e["faults"] for e in index["scenarios"]] == ["none", "none", "host_loss:1", "host_loss:1"]
    assert len({e["seed"] for e in index["scenarios"]}) == 4
    dirs = [str(out / e["name"]) for e in index["scenarios"]]
    assert cli.main(["check", *dirs]) == 0


def test_errors_are_clear_and_exit_2(tmp_path, capsys):
    assert cli.main(["window", "--topology", "no-such", "--out", str(tmp_path)]) == 2
    assert "no such file, preset" in capsys.readouterr().err
    assert cli.main(["window", "--topology", "example", "--faults", "link_loss:1", "--path-fraction", "0",
                     "--out", str(tmp_path)]) == 2
    assert "--any-place" in capsys.readouterr().err
    assert cli.main(["topology"]) == 2
    assert "--preset" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "topology.json").write_text((SCENARIOS / "ex1-link-loss" / "topology.json").read_text())
    obs = json.loads((SCENARIOS / "ex1-link-loss" / "observations.json").read_text())
    obs["probes"][0]["lost"] = -1
    (bad / "observations.json").write_text(json.dumps(obs))
    assert cli.main(["check", str(bad)]) == 1
    assert "probes[0].lost" in capsys.readouterr().err


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_option_of_every_command_has_help(capsys):
    commands = _subparsers(cli.build_parser())
    assert set(commands) == {"topology", "window", "suite", "check"}
    for name, sub in commands.items():
        for action in sub._actions:
            assert action.help, (name, action.dest)
        with pytest.raises(SystemExit) as exc:
            cli.main([name, "--help"])
        assert exc.value.code == 0
        assert "usage:" in capsys.readouterr().out


def test_hook_for_the_testbed_cli(tmp_path):
    parent = argparse.ArgumentParser(prog="python -m testbed")
    subs = parent.add_subparsers(dest="command")
    cli.add_subparser(subs)
    out = tmp_path / "t.json"
    args = parent.parse_args(["simulate", "topology", "--preset", "gpu1024", "--out", str(out)])
    assert args.func(args) == 0
    assert json.loads(out.read_text())["name"] == "rail8-h128-su32-s16x2"


def test_python_dash_m_entry_point():
    done = subprocess.run([sys.executable, "-m", "testbed.simulate", "window", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--faults" in done.stdout
