"""lockstep.observations/v1 parsing (workers/fabric/observations.py): arrays out, and every kind
of bad document refused with a message naming the bad key, name or row."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from workers.fabric.observations import ObservationsError, parse_observations, window_of_arrays
from workers.fabric.paths import PathIndex
from workers.fabric.topology import parse_topology

SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "scenarios"


def hand_index() -> PathIndex:
    """Two leaves under one spine; hosts a (2 NICs), b, c."""
    return PathIndex(parse_topology({
        "format": "lockstep.topology/v1", "name": "hand",
        "hosts": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        "switches": [{"name": "L0", "tier": "leaf"}, {"name": "L1", "tier": "leaf"}, {"name": "S", "tier": "spine"}],
        "nics": [{"name": "a/0", "host": "a"}, {"name": "a/1", "host": "a"}, {"name": "b/0", "host": "b"},
                 {"name": "c/0", "host": "c"}],
        "links": [{"id": "a0", "a": "a/0", "b": "L0"}, {"id": "a1", "a": "a/1", "b": "L1"},
                  {"id": "b0", "a": "b/0", "b": "L0"}, {"id": "c0", "a": "L1", "b": "c/0"},
                  {"id": "L0S", "a": "L0", "b": "S"}, {"id": "L1S", "a": "S", "b": "L1"}],
    }))


def doc(*probes, **extra):
    return {"format": "lockstep.observations/v1", "topology": "hand", "window_s": 1.0, "probes": list(probes)} | extra


def probe(src="a/0", dst="c/0", sent=100, lost=0, **extra):
    return {"src": src, "dst": dst, "sent": sent, "lost": lost} | extra


def test_a_window_becomes_arrays_with_its_known_paths_walked():
    idx = hand_index()
    w = parse_observations(doc(
        probe(owd_us={"p50": 3.0, "p99": 4.5}, path=["a0", "L0S", "L1S", "c0"]),
        probe("b/0", "a/0", 50, 2),
        probe("c/0", "a/1", 10, 10, path=["c0", "a1"], future_key={"x": 1}),
        future_top_level=True,
    ), idx)
    assert list(w.src) == [idx.nic_index["a/0"], idx.nic_index["b/0"], idx.nic_index["c/0"]]
    assert list(w.sent) == [100, 50, 10] and list(w.lost) == [0, 2, 10]
    assert w.p50[0] == 3.0 and w.p99[0] == 4.5 and np.isnan(w.p50[1])
    assert list(w.path_rows) == [0, 2]
    first = w.path_links[w.path_ptr[0]:w.path_ptr[1]]
    assert [idx.link_ids[k] for k in first] == ["a0", "L0S", "L1S", "c0"]
    # a0 is written NIC -> leaf (a -> b); L1S is written S -> L1 and crossed S -> L1 (a -> b);
    # c0 is written L1 -> c/0 and crossed L1 -> c/0
    assert list(w.path_fwd[w.path_ptr[0]:w.path_ptr[1]]) == [True, True, True, True]
    assert list(w.path_fwd[w.path_ptr[1]:w.path_ptr[2]]) == [False, False]
    visited = w.path_switches[w.path_switch_ptr[0]:w.path_switch_ptr[1]]
    assert [idx.switch_names[s] for s in visited] == ["L0", "S", "L1"]
    assert list(w.has_path) == [True, False, True]
    assert w.warnings == ()


def test_the_public_examples_parse():
    for d in sorted(SCENARIOS.iterdir()):
        idx = PathIndex(parse_topology(json.loads((d / "topology.json").read_text())))
        w = parse_observations(json.loads((d / "observations.json").read_text()), idx)
        assert len(w) == 4096


@pytest.mark.parametrize("bad, message", [
    (probe(src="z/9"), "probes[0].src: 'z/9' is not a NIC of topology 'hand'"),
    (probe(dst=7), "probes[0].dst: 7 is not a NIC"),
    (probe(dst="a/0"), "probes[0]: src and dst are the same NIC 'a/0'"),
    (probe(lost=101), "probes[0].lost: 101 is more than sent (100)"),
    (probe(sent=-1, lost=0), "probes[0].sent: -1 is not a non-negative integer"),
    (probe(lost=-3), "probes[0].lost: -3 is not a non-negative integer"),
    (probe(sent="100"), "probes[0].sent: '100' is not a non-negative integer"),
    (probe(sent=1.5), "probes[0].sent: 1.5 is not a non-negative integer"),
    ({"src": "a/0", "dst": "c/0", "sent": 5}, "probes[0]: missing required key 'lost'"),
    (probe(owd_us={"p50": 5.0, "p99": 4.0}), "probes[0].owd_us: p50 5.0 is above p99 4.0"),
    (probe(owd_us={"p50": -1.0, "p99": 4.0}), "probes[0].owd_us.p50: -1.0 is not a non-negative number"),
    (probe(owd_us=[1, 2]), "probes[0].owd_us: must be an object"),
    (probe(path=["a0", "nope", "L1S", "c0"]), "probes[0].path[1]: 'nope' is not a link of topology 'hand'"),
    (probe(path=["a0", "L1S"]), "probes[0].path[1]: link 'L1S' does not touch 'L0'"),
    (probe(path=["a0", "L0S"]), "probes[0].path: ends at 'S', not at dst 'c/0'"),
    (probe(path=["b0", "L0S", "L1S", "c0"]), "probes[0].path[0]: link 'b0' does not touch 'a/0'"),
    (probe(path="a0"), "probes[0].path: must be a non-empty list of link ids"),
    (probe(path=[]), "probes[0].path: must be a non-empty list of link ids"),
    ("not an object", "probes[0]: must be an object, got str"),
])
def test_bad_probes_are_refused_naming_the_row_and_key(bad, message):
    with pytest.raises(ObservationsError) as exc:
        parse_observations(doc(bad), hand_index())
    assert message in str(exc.value)


def test_a_path_through_a_nic_is_refused():
    idx = PathIndex(parse_topology({
        "format": "lockstep.topology/v1", "name": "m",
        "hosts": [{"name": "x"}, {"name": "m"}, {"name": "y"}],
        "switches": [{"name": "L0", "tier": "leaf"}, {"name": "L1", "tier": "leaf"}],
        "nics": [{"name": "x/0", "host": "x"}, {"name": "m/0", "host": "m"}, {"name": "y/0", "host": "y"}],
        "links": [{"id": "x", "a": "x/0", "b": "L0"}, {"id": "m0", "a": "m/0", "b": "L0"},
                  {"id": "m1", "a": "m/0", "b": "L1"}, {"id": "y", "a": "y/0", "b": "L1"}],
    }))
    bad = {"format": "lockstep.observations/v1", "probes": [
        {"src": "x/0", "dst": "y/0", "sent": 1, "lost": 0, "path": ["x", "m0", "m1", "y"]}]}
    with pytest.raises(ObservationsError, match=r"probes\[0\]\.path\[2\]: 'm1' continues through NIC 'm/0'"):
        parse_observations(bad, idx)


def test_a_pair_given_twice_is_refused_naming_both_rows():
    with pytest.raises(ObservationsError, match=r"probes\[2\]: pair a/0 -> c/0 already at probes\[0\]"):
        parse_observations(doc(probe(), probe("b/0", "c/0"), probe()), hand_index())
    # the other direction is another pair
    parse_observations(doc(probe(), probe("c/0", "a/0")), hand_index())


@pytest.mark.parametrize("document, message", [
    ([], "document must be a JSON object, got list"),
    ({"format": "lockstep.observations/v2", "probes": []}, "format: expected 'lockstep.observations/v1'"),
    ({"format": "lockstep.observations/v1"}, "missing required key 'probes'"),
    ({"format": "lockstep.observations/v1", "probes": {}}, "probes: must be a list, got dict"),
    ({"format": "lockstep.observations/v1", "probes": [], "window_s": 0}, "window_s: 0 is not a positive number"),
])
def test_bad_documents_are_refused(document, message):
    with pytest.raises(ObservationsError, match=message.replace("[", r"\[").replace(".", r"\.")):
        parse_observations(document, hand_index())


def test_every_problem_is_listed_and_the_list_is_bounded():
    rows = [probe(lost=200) for _ in range(80)]
    with pytest.raises(ObservationsError) as exc:
        parse_observations(doc(*rows), hand_index())
    assert len(exc.value.errors) == 50
    assert "(first 50 shown)" in str(exc.value)


def test_a_different_topology_name_is_a_warning_not_an_error():
    d = copy.deepcopy(doc(probe()))
    d["topology"] = "other"
    w = parse_observations(d, hand_index())
    assert w.warnings and "'other' is not the name of the topology given ('hand')" in w.warnings[0]


def test_counts_written_as_integral_floats_are_accepted():
    w = parse_observations(doc(probe(sent=100.0, lost=3.0), probe("b/0", "c/0", owd_us={"p50": 1, "p99": 2, "p90": 1.5})),
                           hand_index())
    assert list(w.sent) == [100, 100] and list(w.lost) == [3, 0]
    assert w.p50[1] == 1.0 and w.p99[1] == 2.0


def _arrays_of(document: dict, idx: PathIndex):
    """The rows of a document as the console holds them (workers.probemesh.Pairs' columns)."""
    probes = document["probes"]
    nan = float("nan")
    return dict(
        src=np.array([idx.nic_index[p["src"]] for p in probes], dtype=np.int64),
        dst=np.array([idx.nic_index[p["dst"]] for p in probes], dtype=np.int64),
        sent=np.array([p["sent"] for p in probes], dtype=np.int64),
        lost=np.array([p["lost"] for p in probes], dtype=np.int64),
        p50=np.array([p.get("owd_us", {}).get("p50", nan) for p in probes]),
        p99=np.array([p.get("owd_us", {}).get("p99", nan) for p in probes]),
        paths={i: p["path"] for i, p in enumerate(probes) if "path" in p}, window_s=document.get("window_s"))


def test_rows_given_as_arrays_make_the_window_their_document_makes():
    examples = [(hand_index(), doc(probe(owd_us={"p50": 3.0, "p99": 4.5}, path=["a0", "L0S", "L1S", "c0"]),
                                   probe("b/0", "a/0", 50, 2), probe("c/0", "a/1", 10, 10, path=["c0", "a1"])))]
    for d in sorted(SCENARIOS.iterdir()):
        examples.append((PathIndex(parse_topology(json.loads((d / "topology.json").read_text()))),
                         json.loads((d / "observations.json").read_text())))
    for idx, document in examples:
        parsed = parse_observations(document, idx)
        given = window_of_arrays(idx, **_arrays_of(document, idx))
        for name in ("src", "dst", "sent", "lost", "p50", "p99", "path_rows", "path_ptr", "path_links", "path_fwd",
                     "path_switch_ptr", "path_switches"):
            np.testing.assert_array_equal(getattr(given, name), getattr(parsed, name), err_msg=name)
        assert given.window_s == parsed.window_s


def test_rows_given_as_arrays_are_refused_naming_the_row():
    idx = hand_index()
    rows = _arrays_of(doc(probe(), probe("b/0", "a/0"), probe(), probe("a/1", "a/1")), idx)
    with pytest.raises(ObservationsError) as err:
        window_of_arrays(idx, **rows)
    assert "probes[3]: src and dst are the same NIC 'a/1'" in str(err.value)
    assert "probes[2]: pair a/0 -> c/0 already at probes[0]" in str(err.value)
    rows = _arrays_of(doc(probe(path=["a0", "nowhere"]), probe("b/0", "a/0", path=[])), idx)
    with pytest.raises(ObservationsError, match=r"probes\[1\].path: must be a non-empty list of link ids"):
        window_of_arrays(idx, **rows)
    rows = _arrays_of(doc(probe(path=["a0", "nowhere"])), idx)
    with pytest.raises(ObservationsError, match=r"probes\[0\].path"):
        window_of_arrays(idx, **rows)
