"""Evidence spans: the records of consecutive windows merged into one set of pairs
(workers.probemesh.merge_records) — counts summed per pair, delays weighted by their samples,
paths kept only when every window agrees — and a 5 % loss on a cable too weak to show in one
short window but plain in the span of four."""

from __future__ import annotations

import numpy as np
import pytest

from workers.incidents import windows_for
from workers.probemesh.observations import RECORD_FORMAT, merge_records
from workers.triangulation import FabricModel, triangulate

Q = 250_000_000


def record(nic, start_ns, probes, window_s=0.25):
    return {"format": RECORD_FORMAT, "nic": nic, "start_ns": start_ns, "window_s": window_s,
            "probes": [dict(p, via="probe") for p in probes]}


def test_windows_are_summed_per_pair_and_delays_weighted_by_their_samples():
    records = [
        record("x", 0, [{"src": "x", "dst": "y", "sent": 25, "lost": 0, "owd_us": {"p50": 10.0, "p99": 20.0},
                         "owd_samples": 25, "owd_basis": "clock", "path": ["L1", "L2"]}]),
        record("y", 0, [{"src": "y", "dst": "x", "sent": 25, "lost": 5, "late": 1}]),
        record("x", Q, [{"src": "x", "dst": "y", "sent": 25, "lost": 20, "owd_us": {"p50": 40.0, "p99": 90.0},
                         "owd_samples": 5, "owd_basis": "half_rtt", "path": ["L1", "L3"]}]),
        record("y", Q, [{"src": "y", "dst": "x", "sent": 25, "lost": 0, "unresolved": 2}]),
    ]
    out = merge_records(records).to_document()
    assert (out["start_ns"], out["window_s"]) == (0, 0.5)
    xy, yx = out["probes"]
    assert (xy["src"], xy["sent"], xy["lost"]) == ("x", 50, 20) and (yx["sent"], yx["lost"]) == (50, 5)
    # 25 samples at 10 us, 5 at 40 us
    assert xy["owd_us"] == {"p50": 15.0, "p99": 31.667} and xy["owd_basis"] == "half_rtt"
    assert "path" not in xy  # the windows disagree on it
    assert yx["late"] == 1 and yx["unresolved"] == 2 and "owd_us" not in yx


def test_per_path_counts_of_a_span_add_up_by_path_and_one_window_is_as_before():
    def window(start, lost):
        return record("x", start, [{"src": "x", "dst": "y", "sent": 20, "lost": lost, "paths": [
            {"path": ["L1", "L2"], "sent": 10, "lost": lost}, {"path": ["L1", "L3"], "sent": 10, "lost": 0}]}])

    one = merge_records([window(0, 2)]).to_document()
    assert (one["start_ns"], one["window_s"]) == (0, 0.25) and one["probes"][0]["paths"][0]["lost"] == 2
    spanned = merge_records([window(0, 2), window(Q, 3)]).to_document()["probes"][0]
    assert spanned["paths"] == [{"path": ["L1", "L2"], "sent": 20, "lost": 5}, {"path": ["L1", "L3"], "sent": 20, "lost": 0}]


def test_windows_for_counts_short_windows_in_the_span_and_refuses_a_zero_window():
    assert windows_for(1.0, 0.25) == 4 and windows_for(1.0, 1.0) == 1 and windows_for(1.0, 5.0) == 1
    with pytest.raises(ValueError, match="window_s"):
        windows_for(1.0, 0)


def test_a_five_percent_loss_is_plain_in_a_span_of_short_windows():
    from testbed import generate
    from workers.fabric.topology import parse_topology
    from workers.probeplan import plan_probes

    topology = parse_topology(generate(hosts=4, rails=2, hosts_per_leaf=2, spines=2))
    model = FabricModel(topology)
    peers = plan_probes(topology, seed=1).peers
    victim = sorted(peers)[0]
    rng = np.random.default_rng(4)

    def window(i, sent):  # the NICs' records: sent probes per pair and direction, 5 % through the victim lost
        entries: dict[str, dict] = {}
        for a, bs in peers.items():
            for b in bs:
                for s, d in ((a, b), (b, a)):
                    p = entries.setdefault(s, {}).setdefault(d, {"src": s, "dst": d, "sent": 0, "lost": 0})
                    p["sent"] += sent
                    p["lost"] += int(rng.binomial(sent, 0.05)) if victim in (s, d) else 0
        return [record(nic, i * Q, list(by_dst.values())) for nic, by_dst in entries.items()]

    weak = [window(i, 3) for i in range(4)]  # 3 probes per pair and window: a handful lost in all
    spanned = triangulate(model, merge_records([r for w in weak for r in w]).to_document())
    assert [(c.kind, c.name) for c in spanned.culprits] == [("nic", victim)]
    assert spanned.culprits[0].confidence >= 0.9
    alone = [triangulate(model, merge_records(w).to_document()) for w in weak]
    assert min(max((c.confidence for c in v.culprits if c.name == victim), default=0.0) for v in alone) < 0.9
