"""`python -m workers.triangulation TOPOLOGY.json OBSERVATIONS.json` as a subprocess: the verdict
on stdout with exit 0, and bad input refused with a non-zero exit and a message naming the bad
key, name or line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "tests" / "data" / "scenarios"
EX1 = SCENARIOS / "ex1-link-loss"


def run(topology: Path, observations: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workers.triangulation", str(topology), str(observations), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_prints_the_verdict_of_a_public_example():
    out = run(EX1 / "topology.json", EX1 / "observations.json")
    assert out.returncode == 0, out.stderr
    verdict = json.loads(out.stdout)
    assert verdict["format"] == "lockstep.verdict/v1"
    assert verdict["network_ok"] is False
    assert [(c["kind"], c["name"]) for c in verdict["culprits"]] == [("link", "leaf-su01-r6~spine-p0-00#0")]
    assert 0.9 <= verdict["culprits"][0]["confidence"] <= 1.0


def test_evidence_on_request():
    out = run(EX1 / "topology.json", EX1 / "observations.json", "--evidence")
    assert out.returncode == 0
    assert "loss" in json.loads(out.stdout)["culprits"][0]["evidence"]


def observations_with(tmp_path: Path, edit) -> Path:
    doc = json.loads((EX1 / "observations.json").read_text())
    edit(doc)
    path = tmp_path / "observations.json"
    path.write_text(json.dumps(doc))
    return path


def _set(i, **kv):
    def edit(doc):
        doc["probes"][i].update(kv)
    return edit


def _duplicate(doc):
    doc["probes"].append(dict(doc["probes"][3]))


def _unknown_keys(doc):
    doc["extension"] = {"any": "thing"}
    doc["probes"][0]["ecn_marks"] = 3


@pytest.mark.parametrize("edit, message", [
    (_set(5, src="node9999/nic0"), "probes[5].src: 'node9999/nic0' is not a NIC of topology 'rail8-h32-su8-s4x1'"),
    (_set(7, lost=1001), "probes[7].lost: 1001 is more than sent (1000)"),
    (_set(2, sent=-5), "probes[2].sent: -5 is not a non-negative integer"),
    (_set(2, lost=-1), "probes[2].lost: -1 is not a non-negative integer"),
    (_duplicate, "probes[4096]: pair node0000/nic0 -> node0005/nic0 already at probes[3]"),
    (_set(1, path=["node0000/nic0~leaf-su00-r0", "no-such-link"]), "probes[1].path[1]: 'no-such-link' is not a link"),
    (_set(1, path=["node0000/nic0~leaf-su00-r0", "node0002/nic0~leaf-su00-r0"]),
     "probes[1].path: ends at 'node0002/nic0', not at dst 'node0001/nic0'"),
    (lambda doc: doc.pop("probes"), "missing required key 'probes'"),
    (lambda doc: doc.update(format="lockstep.observations/v0"), "format: expected 'lockstep.observations/v1'"),
])
def test_bad_observations_are_refused_with_a_named_error(tmp_path, edit, message):
    out = run(EX1 / "topology.json", observations_with(tmp_path, edit))
    assert out.returncode == 2
    assert out.stdout == ""
    assert message in out.stderr, out.stderr


def test_unknown_keys_are_ignored(tmp_path):
    out = run(EX1 / "topology.json", observations_with(tmp_path, _unknown_keys))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["culprits"][0]["name"] == "leaf-su01-r6~spine-p0-00#0"


def test_a_json_syntax_error_names_the_line(tmp_path):
    text = (EX1 / "observations.json").read_text().splitlines()
    text[10] = text[10].replace('"sent":', '"sent"')
    path = tmp_path / "broken.json"
    path.write_text("\n".join(text))
    out = run(EX1 / "topology.json", path)
    assert out.returncode == 2
    assert f"{path}: line 11 column" in out.stderr


def test_a_bad_topology_is_refused_naming_the_entry(tmp_path):
    doc = json.loads((EX1 / "topology.json").read_text())
    doc["links"][0]["b"] = "no-such-switch"
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(doc))
    out = run(path, EX1 / "observations.json")
    assert out.returncode == 2
    assert "links[0].b: 'no-such-switch' is not a NIC or switch" in out.stderr


def test_a_missing_file_is_an_error(tmp_path):
    out = run(EX1 / "topology.json", tmp_path / "absent.json")
    assert out.returncode == 2
    assert "absent.json" in out.stderr and "No such file" in out.stderr
