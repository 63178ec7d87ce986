"""Evidence spans (workers.incidents.evidence): consecutive windows summed per pair, delays
weighted by delivered probes, paths kept only when every window agrees, and a 5 % loss on a cable
too weak to show in one short window but plain in the span of four."""

from __future__ import annotations

import numpy as np
import pytest

from workers.incidents import span, windows_for
from workers.triangulation import FabricModel, triangulate

Q = 250_000_000


def doc(start_ns, probes, window_s=0.25):
    return {"format": "lockstep.observations/v1", "window_s": window_s, "start_ns": start_ns, "probes": probes}


def test_windows_are_summed_per_pair_and_delays_weighted_by_what_was_delivered():
    a = doc(0, [{"src": "x", "dst": "y", "sent": 25, "lost": 0, "owd_us": {"p50": 10.0, "p99": 20.0},
                 "owd_basis": "clock", "path": ["L1", "L2"]},
                {"src": "y", "dst": "x", "sent": 25, "lost": 5, "late": 1}])
    b = doc(Q, [{"src": "x", "dst": "y", "sent": 25, "lost": 20, "owd_us": {"p50": 40.0, "p99": 90.0},
                 "owd_basis": "half_rtt", "path": ["L1", "L3"]},
                {"src": "y", "dst": "x", "sent": 25, "lost": 0, "unresolved": 2}])
    out = span([a, b])
    assert (out["start_ns"], out["window_s"]) == (0, 0.5)
    xy, yx = out["probes"]
    assert (xy["src"], xy["sent"], xy["lost"]) == ("x", 50, 20) and (yx["sent"], yx["lost"]) == (50, 5)
    # 25 delivered at 10 us, 5 at 40 us
    assert xy["owd_us"] == {"p50": 15.0, "p99": 31.667} and xy["owd_basis"] == "half_rtt"
    assert "path" not in xy  # the windows disagree on it
    assert yx["late"] == 1 and yx["unresolved"] == 2 and "owd_us" not in yx


def test_one_window_is_its_own_span_and_an_empty_span_is_refused():
    a = doc(0, [{"src": "x", "dst": "y", "sent": 25, "lost": 1}])
    assert span([a]) is a
    with pytest.raises(ValueError, match="no windows"):
        span([])
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

    def window(i, sent):  # sent probes per pair and direction; 5 % of those through the victim lost
        probes = {}
        for a, bs in peers.items():
            for b in bs:
                for s, d in ((a, b), (b, a)):
                    p = probes.setdefault((s, d), {"src": s, "dst": d, "sent": 0, "lost": 0})
                    p["sent"] += sent
                    p["lost"] += int(rng.binomial(sent, 0.05)) if victim in (s, d) else 0
        return doc(i * Q, list(probes.values()))

    weak = [window(i, 3) for i in range(4)]  # 3 probes per pair and window: a handful lost in all
    spanned = triangulate(model, span(weak))
    assert [(c.kind, c.name) for c in spanned.culprits] == [("nic", victim)]
    assert spanned.culprits[0].confidence >= 0.9
    alone = [triangulate(model, w) for w in weak]
    assert min(max((c.confidence for c in v.culprits if c.name == victim), default=0.0) for v in alone) < 0.9
