"""Simulated windows (testbed/simulate/window.py, model.py): statistics match the configured
faults and noise, ground truth follows formats/fabric.md, output is deterministic.

Every check recomputes what it needs from the written documents with the path index (not from
the simulator's internals), so a simulator that drops the wrong probes fails here. All draws are
seeded: the tolerances are several standard deviations of the binomial/ordinal sampling noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from testbed.simulate import model
from testbed.simulate.checks import FormatError, check_observations, check_verdict
from testbed.simulate.topology import PRESETS, generate_topology
from testbed.simulate.window import (
    SimulationError,
    WindowConfig,
    dump_observations,
    dump_truth,
    parse_faults,
    simulate,
)
from workers.fabric.paths import PathIndex
from workers.fabric.topology import parse_topology

SCENARIOS = Path(__file__).resolve().parents[1] / "data" / "scenarios"
EXAMPLES = sorted(p for p in SCENARIOS.iterdir() if (p / "truth.json").exists())
EXAMPLE_DOC = generate_topology(PRESETS["example"][0])
EXAMPLE_TOPO = parse_topology(EXAMPLE_DOC)
EXAMPLE_INDEX = PathIndex(EXAMPLE_TOPO)


def window(faults="none", seed=1, topo=EXAMPLE_TOPO, **kw):
    return simulate(topo, WindowConfig(faults=faults, seed=seed, **kw))


class Probes:
    """The observations of a scenario as arrays, with the incidence of its pairs (and paths)."""

    def __init__(self, scenario, index=EXAMPLE_INDEX):
        probes = scenario.observations["probes"]
        self.index = index
        self.sent = np.array([p["sent"] for p in probes])
        self.lost = np.array([p["lost"] for p in probes])
        self.p50 = np.array([p.get("owd_us", {}).get("p50", np.nan) for p in probes])
        self.p99 = np.array([p.get("owd_us", {}).get("p99", np.nan) for p in probes])
        self.src = [p["src"] for p in probes]
        self.dst = [p["dst"] for p in probes]
        self.has_path = np.array(["path" in p for p in probes])
        self.inc = index.incidence(list(zip(self.src, self.dst, strict=True)), [p.get("path") for p in probes])
        self.hops = self.inc.hops
        self.src_host = np.array([s.split("/")[0] for s in self.src])
        self.dst_host = np.array([d.split("/")[0] for d in self.dst])

    def exposure(self, culprit) -> np.ndarray:
        """Fraction of each pair's probes crossing the culprit (in its faulty direction), per end
        for NICs and hosts."""
        kind, name = culprit["kind"], culprit["name"]
        if kind == "link":
            fwd, rev = self.inc.link_fractions([name], directed=True)
            d = culprit.get("direction", "both")
            return (fwd[:, 0] if d != "b-to-a" else 0) + (rev[:, 0] if d != "a-to-b" else 0)
        if kind == "switch":
            return self.inc.switch_fractions([name])[:, 0]
        if kind == "nic":
            return self.inc.nic_counts([name])[:, 0]
        return self.inc.host_counts([name])[:, 0]

    def clean(self, scenario) -> np.ndarray:
        """Pairs touching no fault and no noisy host."""
        ok = np.ones(len(self.sent), dtype=bool)
        for c in scenario.truth["culprits"]:
            ok &= self.exposure(c) == 0
            if c["kind"] == "host":
                ok &= (self.src_host != c["name"]) & (self.dst_host != c["name"])
        for h in scenario.truth["scenario"]["noisy_hosts"]:
            ok &= (self.src_host != h["host"]) & (self.dst_host != h["host"])
        return ok


def assert_rate(lost, trials, rate, rel=0.1):
    """Measured lost/trials is the rate within 5 binomial sd (and a relative slack)."""
    sd = np.sqrt(trials * rate * (1 - rate))
    assert abs(lost - trials * rate) <= 5 * sd + rel * trials * rate, (lost, trials * rate, sd)


# ---- determinism and formats -----------------------------------------------------------------


def test_same_seed_gives_identical_files_and_another_seed_does_not():
    a = window("link_loss:1,host_loss:1", seed=5)
    b = window("link_loss:1,host_loss:1", seed=5)
    c = window("link_loss:1,host_loss:1", seed=6)
    assert dump_observations(a.observations) == dump_observations(b.observations)
    assert dump_truth(a.truth) == dump_truth(b.truth)
    assert dump_observations(a.observations) != dump_observations(c.observations)
    # the probe pairs do not depend on the faults
    healthy = window("none", seed=5)
    assert [(p["src"], p["dst"]) for p in healthy.observations["probes"]] == \
        [(p["src"], p["dst"]) for p in a.observations["probes"]]


@pytest.mark.parametrize("scenario", EXAMPLES, ids=lambda p: p.name)
def test_public_examples_pass_our_format_checks(scenario):
    topo = parse_topology(json.loads((scenario / "topology.json").read_text()))
    check_observations(json.loads((scenario / "observations.json").read_text()), topo)
    check_verdict(json.loads((scenario / "truth.json").read_text()), topo)


def test_format_checks_name_what_is_wrong():
    obs = json.loads((EXAMPLES[0] / "observations.json").read_text())
    obs["probes"][3]["lost"] = obs["probes"][3]["sent"] + 1
    obs["probes"][5]["dst"] = "node9999/nic0"
    obs["probes"][7]["path"] = ["node0000/nic0~leaf-su00-r0", "node0005/nic5~leaf-su00-r5"]
    with pytest.raises(FormatError) as err:
        check_observations(obs, EXAMPLE_TOPO)
    text = str(err.value)
    assert "probes[3].lost" in text and "probes[5].dst" in text and "probes[7].path" in text
    truth = {"format": "lockstep.verdict/v1", "network_ok": True,
             "culprits": [{"kind": "link", "name": "leaf-su00-r0~spine-p0-00#0", "confidence": 1.0}]}
    with pytest.raises(FormatError, match="network_ok"):
        check_verdict(truth, EXAMPLE_TOPO)


ALL_KINDS = ",".join(f"{k}:1" for k in model.FAULT_KINDS)


def test_every_fault_kind_at_once_gives_valid_documents():
    s = window(ALL_KINDS, seed=3)
    check_observations(s.observations, EXAMPLE_TOPO)
    check_verdict(s.truth, EXAMPLE_TOPO)
    assert [c["fault"] for c in s.truth["culprits"]] == list(model.FAULT_KINDS)
    assert s.truth["network_ok"] is False
    # smallest common element: no culprit nested in another
    hosts = {c["name"] for c in s.truth["culprits"] if c["kind"] == "host"}
    assert not any(c["kind"] == "nic" and c["name"].split("/")[0] in hosts for c in s.truth["culprits"])
    assert len({(c["kind"], c["name"]) for c in s.truth["culprits"]}) == len(s.truth["culprits"])


# ---- the shape and statistics of the public examples ----------------------------------------


def _hop_stats(probes: Probes, mask):
    out = {}
    for h in (2, 4):
        m = mask & (probes.hops == h)
        out[h] = (np.median(probes.p50[m]), np.median(probes.p99[m]), np.std(probes.p50[m]), np.std(probes.p99[m]))
    return out


def test_a_healthy_window_looks_like_the_public_healthy_example():
    ex = json.loads((SCENARIOS / "ex3-healthy" / "truth.json").read_text())["scenario"]
    ours = window("none", seed=ex["seed"], path_fraction=ex["path_fraction"], noisy_hosts=2)
    assert ours.truth["scenario"]["pairs"] == ex["pairs"] == 4096
    for key in ("topology", "topo_params", "faults_spec", "peers_per_nic", "peer_mix", "sent", "path_fraction",
                "bg_loss", "identifiable_only"):
        assert ours.truth["scenario"][key] == ex[key], key

    class _Obs:  # the public example, read with the same helper
        observations = json.loads((SCENARIOS / "ex3-healthy" / "observations.json").read_text())
        truth = json.loads((SCENARIOS / "ex3-healthy" / "truth.json").read_text())

    theirs = Probes(_Obs)
    mine = Probes(ours)
    a, b = _hop_stats(mine, mine.clean(ours)), _hop_stats(theirs, theirs.clean(_Obs))
    for h in (2, 4):
        assert a[h][0] == pytest.approx(b[h][0], abs=0.02)  # median p50
        assert a[h][1] == pytest.approx(b[h][1], abs=0.05)  # median p99
        assert a[h][2] == pytest.approx(b[h][2], rel=0.5)  # spread of p50 between pairs
        assert a[h][3] == pytest.approx(b[h][3], rel=0.5)  # spread of p99 between pairs
    # the peer mix: 4 on the same leaf, 8 on the same rail elsewhere, 4 on other rails, per NIC
    leaf = {link.a: link.b for link in EXAMPLE_TOPO.links if EXAMPLE_TOPO.is_nic(link.a)}
    rail = {n.name: n.rail for n in EXAMPLE_TOPO.nics}
    per_src: dict[str, list[int]] = {}
    for s, d in zip(mine.src, mine.dst, strict=True):
        c = per_src.setdefault(s, [0, 0, 0])
        c[0 if leaf[s] == leaf[d] else (1 if rail[s] == rail[d] else 2)] += 1
    assert len(per_src) == 256 and all(c == [4, 8, 4] for c in per_src.values())
    # healthy loss: a few per million per link
    clean = mine.clean(ours)
    assert mine.lost[clean].sum() / mine.sent[clean].sum() < 3e-5
    assert 0 < (mine.lost[clean] > 0).mean() < 0.05


def test_known_paths_follow_the_path_fraction():
    s = window("none", seed=2, path_fraction=0.3)
    frac = s.truth["scenario"]["pairs_with_path"] / s.truth["scenario"]["pairs"]
    assert frac == pytest.approx(0.3, abs=0.03)
    for p in s.observations["probes"]:
        if "path" in p:
            assert EXAMPLE_INDEX.is_shortest_path(p["src"], p["dst"], p["path"])


# ---- loss faults -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["link_loss", "switch_loss", "nic_loss", "host_loss", "link_congestion"])
def test_measured_drop_over_all_traversals_is_the_fault_rate(kind):
    s = window(f"{kind}:1", seed=21, noisy_hosts=0)
    (culprit,) = s.truth["culprits"]
    pr = Probes(s)
    x = pr.exposure(culprit)
    touched = x > 0
    assert touched.sum() == culprit["pairs_touched"]
    traversals = float((pr.sent * x).sum())
    assert traversals == pytest.approx(culprit["probe_traversals"], abs=0.1)
    # background over the touched pairs' own paths is at most 1e-5 per link
    bg = (pr.sent[touched] * pr.hops[touched]).sum() * 1e-5
    assert_rate(pr.lost[touched].sum() - bg / 2, traversals, culprit["drop"])
    # the pairs that do not touch it see background loss only
    clean = pr.clean(s)
    assert pr.lost[clean].sum() / pr.sent[clean].sum() < 6e-5


@pytest.mark.parametrize("kind", ["link_down", "nic_down"])
def test_down_elements_lose_everything_that_must_cross_them(kind):
    s = window(f"{kind}:1", seed=8, noisy_hosts=0)
    (culprit,) = s.truth["culprits"]
    pr = Probes(s)
    x = pr.exposure(culprit)
    full = x >= 1
    assert full.any()
    assert np.all(pr.lost[full] == pr.sent[full])
    assert all("owd_us" not in s.observations["probes"][i] for i in np.flatnonzero(full))
    part = (x > 0) & ~full  # ECMP pairs with some paths through the dead link
    if part.any():
        assert_rate(pr.lost[part].sum(), (pr.sent[part] * x[part]).sum(), 1.0 - 1e-9, rel=0.05)
        assert np.all(pr.lost[part] < pr.sent[part])


def test_one_direction_link_loss_spares_the_other_direction():
    for seed in range(100, 200):
        s = window("link_loss:1", seed=seed, noisy_hosts=0)
        (c,) = s.truth["culprits"]
        if c["direction"] != "both":
            break
    else:
        pytest.fail("no one-direction link fault drawn in 100 seeds")
    pr = Probes(s)
    fwd, rev = pr.inc.link_fractions([c["name"]], directed=True)
    faulty, other = (fwd[:, 0], rev[:, 0]) if c["direction"] == "a-to-b" else (rev[:, 0], fwd[:, 0])
    k = EXAMPLE_INDEX.link_index[c["name"]]
    assert (c["from"], c["to"]) == ((EXAMPLE_INDEX.link_a[k], EXAMPLE_INDEX.link_b[k]) if c["direction"] == "a-to-b"
                                    else (EXAMPLE_INDEX.link_b[k], EXAMPLE_INDEX.link_a[k]))
    hit, spared = faulty > 0, (other > 0) & (faulty == 0)
    assert hit.any() and spared.any()
    assert_rate(pr.lost[hit].sum(), (pr.sent[hit] * faulty[hit]).sum(), c["drop"])
    assert pr.lost[spared].sum() / pr.sent[spared].sum() < 1e-4


def test_host_stall_loses_inbound_probes_and_silences_the_host():
    for seed in range(30, 60):
        s = window("host_stall:1", seed=seed, noisy_hosts=0)
        (c,) = s.truth["culprits"]
        if c["stall"] < 1.0:
            break
    assert c["stall"] < 1.0
    pr = Probes(s)
    inbound = (pr.dst_host == c["name"]) & (pr.src_host != c["name"])
    assert_rate(pr.lost[inbound].sum(), pr.sent[inbound].sum(), c["stall"])
    outbound = pr.src_host == c["name"]
    assert np.all(pr.sent[outbound] == round(1000 * (1 - c["stall"])))
    assert s.truth["network_ok"] is True
    for seed in range(30, 60):
        full = window("host_stall:1", seed=seed, noisy_hosts=0)
        if full.truth["culprits"][0]["stall"] == 1.0:
            break
    host = full.truth["culprits"][0]["name"]
    assert full.truth["culprits"][0]["stall"] == 1.0
    probes = full.observations["probes"]
    assert not any(p["src"].startswith(host + "/") for p in probes)  # a frozen agent reports nothing
    assert all(p["lost"] == p["sent"] for p in probes if p["dst"].startswith(host + "/"))


# ---- delay faults and noise ------------------------------------------------------------------


def test_noisy_hosts_raise_p99_but_not_p50_or_loss():
    s = window("none", seed=4, noisy_hosts=3, path_fraction=0.0)
    pr = Probes(s)
    clean = pr.clean(s)
    noisy = s.truth["scenario"]["noisy_hosts"]
    assert len(noisy) == 3 and s.truth["culprits"] == [] and s.truth["network_ok"] is True
    for h in noisy:
        one_end = (pr.src_host == h["host"]) ^ (pr.dst_host == h["host"])
        for hop in (2, 4):
            m, ref = one_end & (pr.hops == hop), clean & (pr.hops == hop)
            assert np.median(pr.p50[m]) == pytest.approx(np.median(pr.p50[ref]), abs=0.03)
            expected_p99 = np.median(pr.p99[ref]) + h["tail_mean_us"] * np.log(h["tail_p"] / 0.01)
            assert np.median(pr.p99[m]) == pytest.approx(expected_p99, rel=0.25)
            assert np.median(pr.p99[m]) > 10 * np.median(pr.p99[ref])
        touched = (pr.src_host == h["host"]) | (pr.dst_host == h["host"])
        assert pr.lost[touched].sum() / pr.sent[touched].sum() < 6e-5


def test_host_delay_shifts_the_median_without_loss():
    s = window("host_delay:1", seed=9, noisy_hosts=0)
    (c,) = s.truth["culprits"]
    pr = Probes(s)
    one_end = (pr.src_host == c["name"]) ^ (pr.dst_host == c["name"])
    ref = pr.clean(s)
    for hop in (2, 4):
        m = one_end & (pr.hops == hop)
        shift = np.median(pr.p50[m]) - np.median(pr.p50[ref & (pr.hops == hop)])
        assert shift == pytest.approx(c["shift_us"], rel=0.1)
    assert pr.lost[one_end].sum() / pr.sent[one_end].sum() < 6e-5
    assert c["kind"] == "host" and s.truth["network_ok"] is True


def test_congestion_delays_the_probes_that_queue_behind_it():
    s = window("link_congestion:1", seed=12, noisy_hosts=0)
    (c,) = s.truth["culprits"]
    pr = Probes(s)
    x = pr.exposure(c)
    always = x >= 1  # known path through the congested direction
    assert always.any()
    assert np.all(pr.p99[always] > 10)
    ref = pr.clean(s)
    assert np.all(pr.p99[ref] < 10)
    # p50 moves only where more than half of the probes queue
    busy = c["busy"]
    for i in np.flatnonzero(x > 0):
        if x[i] * busy < 0.3:
            assert pr.p50[i] < 6
        elif x[i] * busy > 0.7:
            assert pr.p50[i] > 6


# ---- ground truth ----------------------------------------------------------------------------


def test_a_nic_and_its_access_link_are_named_as_the_nic():
    seen_link, seen_nic = False, False
    for seed in range(40):
        s = window("nic_loss:1", seed=seed, noisy_hosts=0)
        (c,) = s.truth["culprits"]
        assert c["kind"] == "nic" and EXAMPLE_TOPO.is_nic(c["name"])
        access = f"{c['name']}~"
        assert any(e.startswith(access) for e in c["equivalent"])
        if c.get("element", c["name"]).startswith(access):
            seen_link = True
        else:
            seen_nic = True
        if seen_link and seen_nic:
            break
    assert seen_link and seen_nic


def test_network_ok_is_true_only_when_hosts_alone_are_culprits():
    healthy = window("none").truth
    assert healthy["network_ok"] is True and healthy["culprits"] == []
    assert window("host_loss:1").truth["network_ok"] is True
    assert window("host_loss:1,switch_loss:1").truth["network_ok"] is False
    assert window("nic_down:1").truth["network_ok"] is False


def test_faults_go_only_where_the_probes_can_tell_them_apart():
    with pytest.raises(SimulationError, match="identify"):
        window("link_loss:1", path_fraction=0.0)
    s = window("link_loss:1", path_fraction=0.0, identifiable_only=False)
    (c,) = s.truth["culprits"]
    leaf = c["name"].split("~")[0]
    # without known paths, all uplinks of a leaf carry the same pairs with the same fractions
    if c["direction"] == "both":
        assert sorted(c["equivalent"]) == sorted(
            link.id for link in EXAMPLE_TOPO.links if link.a == leaf and link.id != c["name"])
    assert s.truth["scenario"]["identifiable_only"] is False
    with_paths = window("link_loss:2,switch_loss:1", path_fraction=0.3)
    assert all(c["equivalent"] == [] for c in with_paths.truth["culprits"])


def test_bad_specs_are_named():
    assert parse_faults("link:2,switch") == ["link_loss", "link_loss", "switch_loss"]
    assert parse_faults("none") == []
    with pytest.raises(SimulationError, match="bogus"):
        parse_faults("bogus:1")
    with pytest.raises(SimulationError, match="integer"):
        parse_faults("link_loss:x")
    with pytest.raises(SimulationError, match="path_fraction"):
        WindowConfig(path_fraction=2.0)
    with pytest.raises(SimulationError, match="no place left"):
        window("host_loss:40")


# ---- scale -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_nine_thousand_gpu_window():
    topo = parse_topology(generate_topology(PRESETS["gpu9216"][0]))
    s = simulate(topo, WindowConfig(faults="link_loss:1,host_loss:1", seed=1))
    assert s.truth["scenario"]["pairs"] == 9216 * 16
    check_observations(s.observations, topo)
    check_verdict(s.truth, topo)
    index = PathIndex(topo)
    probes = s.observations["probes"]
    hops = index.incidence([(p["src"], p["dst"]) for p in probes]).hops
    assert set(hops.tolist()) == {2, 4, 6}
    link = s.truth["culprits"][0]
    assert link["kind"] == "link" and link["pairs_touched"] > 0 and link["equivalent"] == []


def test_truth_counts_cover_the_reported_pairs_only():
    for seed in range(30, 60):
        s = window("host_stall:1", seed=seed, noisy_hosts=0)
        if s.truth["culprits"][0]["stall"] == 1.0:
            break
    (c,) = s.truth["culprits"]
    probes = s.observations["probes"]
    touching = [p for p in probes if c["name"] in (p["src"].split("/")[0], p["dst"].split("/")[0])]
    assert c["pairs_touched"] == len(touching) > 0
    assert s.truth["scenario"]["pairs"] == len(probes) < 4096
