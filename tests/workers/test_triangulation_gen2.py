"""The triangulation on windows of the benchmark's second generator (bench/triangulation/gen2.py:
other topologies, names, noise and delay models, probe-by-probe simulation): valid documents,
and the faults named exactly."""

from __future__ import annotations

import pytest

from bench.triangulation import gen2
from testbed.simulate.checks import check_observations, check_verdict
from workers.fabric.topology import parse_topology
from workers.triangulation import triangulate


@pytest.mark.parametrize("seed", [0, 1, 4, 6, 8, 9])
def test_second_generator_windows_are_localized(seed):
    sc = gen2.scenario(seed, size="small")
    topo = parse_topology(sc.topology)
    check_observations(sc.observations, topo)
    check_verdict(sc.truth, topo)
    verdict = triangulate(topo, sc.observations)
    assert {(c.kind, c.name) for c in verdict.culprits} == {(c["kind"], c["name"]) for c in sc.truth["culprits"]}
    assert verdict.network_ok == sc.truth["network_ok"]


def test_the_second_generator_is_deterministic_for_a_seed():
    a, b = gen2.scenario(3, size="small"), gen2.scenario(3, size="small")
    assert a.observations == b.observations and a.truth == b.truth
