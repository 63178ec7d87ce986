"""probe.window records of one window -> lockstep.observations/v1: merging both measurements of
a direction, settling unresolved losses with the responder's count, paths, refusals named."""

from __future__ import annotations

import pytest

from workers.probemesh.observations import ProbeWindowError, check_record, observations

START = 1796400000000000000


def fwd(src, dst, sent=100, lost=0, unresolved=0, late=0, answered=None, owd=(5.0, 9.0), basis="clock", **kw):
    e = {"src": src, "dst": dst, "via": "probe", "sent": sent, "lost": lost, "unresolved": unresolved,
         "late": late, "answered": sent - lost if answered is None else answered}
    if owd:
        e |= {"owd_us": {"p50": owd[0], "p99": owd[1]}, "owd_samples": sent - lost, "owd_basis": basis}
    return e | kw


def echo(src, dst, sent=100, lost=0, owd=(6.0, 10.0), basis="clock"):
    e = {"src": src, "dst": dst, "via": "echo", "sent": sent, "lost": lost, "late": 0}
    if owd:
        e |= {"owd_us": {"p50": owd[0], "p99": owd[1]}, "owd_samples": sent - lost, "owd_basis": basis}
    return e


def rec(nic, probes, received=(), start=START):
    return {"format": "lockstep.probe.window/v1", "nic": nic, "start_ns": start, "window_s": 1.0, "clock": "cluster",
            "probes": probes, "received": [{"src": s, "start_ns": start, "probes": n} for s, n in received]}


def by_pair(doc):
    return {(p["src"], p["dst"]): p for p in doc["probes"]}


def test_both_measurements_of_a_direction_are_added_and_delays_weighted():
    records = [
        rec("a/nic0", [fwd("a/nic0", "b/nic0", owd=(4.0, 8.0)), echo("b/nic0", "a/nic0", owd=(6.0, 12.0))]),
        rec("b/nic0", [fwd("b/nic0", "a/nic0", sent=300, owd=(2.0, 4.0)), echo("a/nic0", "b/nic0", sent=300)]),
    ]
    doc = observations(records, topology="t")
    assert doc["format"] == "lockstep.observations/v1" and doc["topology"] == "t" and doc["window_s"] == 1.0
    pairs = by_pair(doc)
    ab, ba = pairs[("a/nic0", "b/nic0")], pairs[("b/nic0", "a/nic0")]
    assert (ab["sent"], ab["lost"]) == (400, 0) and (ba["sent"], ba["lost"]) == (400, 0)
    assert ba["owd_us"] == {"p50": 3.0, "p99": 6.0}  # (100 x 6 + 300 x 2) / 400, (100 x 12 + 300 x 4) / 400
    assert ba["owd_basis"] == "clock"


def test_an_unresolved_loss_the_responder_received_is_the_echos_not_the_probes():
    # a -> b works, b -> a is dead: a's probes arrive (b counts 100) but no echo comes back
    records = [
        rec("a/nic0", [fwd("a/nic0", "b/nic0", lost=100, unresolved=100, answered=0, owd=None),
                       echo("b/nic0", "a/nic0", sent=0, owd=None)]),
        rec("b/nic0", [], received=[("a/nic0", 100)]),
    ]
    pairs = by_pair(observations(records))
    assert pairs[("a/nic0", "b/nic0")]["lost"] == 0
    assert (pairs[("b/nic0", "a/nic0")]["sent"], pairs[("b/nic0", "a/nic0")]["lost"]) == (100, 100)


def test_an_unresolved_loss_the_responder_did_not_receive_stays_forward():
    records = [
        rec("a/nic0", [fwd("a/nic0", "b/nic0", lost=100, unresolved=100, answered=0, owd=None),
                       echo("b/nic0", "a/nic0", sent=0, owd=None)]),
        rec("b/nic0", [], received=[("c/nic0", 100)]),
    ]
    pairs = by_pair(observations(records))
    assert (pairs[("a/nic0", "b/nic0")]["sent"], pairs[("a/nic0", "b/nic0")]["lost"]) == (100, 100)
    assert ("b/nic0", "a/nic0") not in pairs  # nothing was sent that way


def test_without_the_responders_record_unresolved_losses_stay_forward():
    records = [rec("a/nic0", [fwd("a/nic0", "b/nic0", lost=60, unresolved=50, answered=40),
                              echo("b/nic0", "a/nic0", sent=50, lost=10)])]
    ab = by_pair(observations(records))[("a/nic0", "b/nic0")]
    assert ab["lost"] == 60 and ab["unresolved"] == 50


def test_half_round_trip_delays_are_marked_and_can_be_left_out():
    records = [rec("a/nic0", [fwd("a/nic0", "b/nic0", basis="half_rtt"), echo("b/nic0", "a/nic0", basis="half_rtt")])]
    assert by_pair(observations(records))[("a/nic0", "b/nic0")]["owd_basis"] == "half_rtt"
    assert "owd_us" not in by_pair(observations(records, half_rtt=False))[("a/nic0", "b/nic0")]


def test_a_path_is_kept_only_when_every_measurement_agrees():
    p = ["L0", "L1", "L2"]
    records = [rec("a/nic0", [fwd("a/nic0", "b/nic0", path=p), echo("b/nic0", "a/nic0")])]
    assert by_pair(observations(records))[("a/nic0", "b/nic0")]["path"] == p
    records.append(rec("b/nic0", [fwd("b/nic0", "a/nic0"), echo("a/nic0", "b/nic0")]))
    merged = by_pair(observations(records))[("a/nic0", "b/nic0")]
    assert "path" not in merged  # b's echoes to a took an unknown path


def test_a_lossy_pairs_breakdown_by_path_is_kept():
    breakdown = [{"path": ["L0", "L5"], "sent": 50, "lost": 10, "ports": 4}, {"path": None, "sent": 50, "lost": 0}]
    records = [rec("a/nic0", [fwd("a/nic0", "b/nic0", lost=10, paths=breakdown), echo("b/nic0", "a/nic0")])]
    assert by_pair(observations(records))[("a/nic0", "b/nic0")]["paths"] == breakdown


@pytest.mark.parametrize(("records", "message"), [
    ("x", "records: must be a list"),
    ([{"format": "other"}], "records[0].format"),
    ([rec("a/nic0", [fwd("a/nic0", "b/nic0", lost=101)])], "records[0].probes[0].lost: 101 is more than sent 100"),
    ([rec("a/nic0", [fwd("a/nic0", "b/nic0", sent=-1, lost=0)])], "records[0].probes[0].sent: -1 is not a count"),
    ([rec("a/nic0", [fwd("b/nic0", "a/nic0")])], "records[0].probes[0].src: a probe entry of 'a/nic0' must start there"),
    ([rec("a/nic0", [echo("b/nic0", "c/nic0")])], "records[0].probes[0].dst"),
    ([rec("a/nic0", [fwd("a/nic0", "b/nic0") | {"via": "x"}])], "records[0].probes[0].via"),
    ([rec("a/nic0", [fwd("a/nic0", "b/nic0") | {"owd_us": {"p50": -1, "p99": 2}}])], "records[0].probes[0].owd_us"),
    ([rec("a/nic0", []), rec("b/nic0", [], start=START + 1)], "2 different windows"),
    ([rec("a/nic0", [], received=[("b/nic0", -3)])], "records[0].received[0].probes: -3 is not a count"),
])
def test_bad_records_are_refused_with_the_field_named(records, message):
    with pytest.raises(ProbeWindowError) as err:
        observations(records)
    assert message in str(err.value)


def test_one_record_can_be_checked_alone_as_a_telemetry_validator_would():
    check_record(rec("a/nic0", [fwd("a/nic0", "b/nic0"), echo("b/nic0", "a/nic0")]))
    with pytest.raises(ProbeWindowError, match=r"^data.probes\[0\].lost: 101 is more than sent 100$"):
        check_record(rec("a/nic0", [fwd("a/nic0", "b/nic0", lost=101)]))


def test_delays_are_rounded_exactly_as_pythons_round_to_three_decimals_for_any_value():
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from workers.probemesh.observations import _round3

    finite = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)
    # values already at three decimals (numpy's round gives them back) and arbitrary ones
    three_decimals = st.integers(min_value=0, max_value=10**12).map(lambda k: k / 1000)
    halves = st.integers(min_value=0, max_value=10**9).map(lambda k: k / 1000 + 0.0005)  # numpy's round differs

    @settings(max_examples=400, deadline=None)
    @given(st.lists(st.one_of(finite, three_decimals, halves), min_size=1, max_size=50))
    def check(values):
        got = _round3(np.array(values, dtype=np.float64)).tolist()
        assert got == [round(v, 3) for v in values]

    check()
