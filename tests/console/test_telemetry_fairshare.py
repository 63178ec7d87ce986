"""The telemetry fair-share admission (pure: the test passes the clock)."""

from __future__ import annotations

import pytest

from console.telemetry.fairshare import INFLIGHT_RETRY_S, FairShare, Shares

MIB = 1024 * 1024


def shares(**overrides) -> FairShare:
    values = {"node_inflight": 1, "node_bytes_per_s": 1 * MIB, "node_burst_bytes": 4 * MIB}
    return FairShare(Shares(**{**values, **overrides}))


def test_one_node_gets_one_batch_at_a_time_and_the_next_after_release():
    fair = shares()
    assert fair.admit(1, MIB, now=0.0) == 0.0
    assert fair.admit(1, MIB, now=0.0) == INFLIGHT_RETRY_S  # its second parallel batch waits
    fair.release(1)
    assert fair.admit(1, MIB, now=0.0) == 0.0


def test_a_node_over_its_byte_rate_is_told_how_long_to_wait():
    fair = shares()
    for _ in range(4):  # the burst: four 1 MiB batches at once (one after another)
        assert fair.admit(1, MIB, now=0.0) == 0.0
        fair.release(1)
    assert fair.admit(1, MIB, now=0.0) == pytest.approx(1.0)  # 1 MiB at 1 MiB/s
    assert fair.admit(1, MIB, now=0.5) == pytest.approx(0.5)
    assert fair.admit(1, MIB, now=1.0) == 0.0
    fair.release(1)
    assert fair.admit(2, MIB, now=1.0) == 0.0  # another node has its own bucket


def test_a_batch_larger_than_the_burst_needs_a_full_bucket_and_is_paid_for_after():
    fair = shares(node_burst_bytes=MIB)
    assert fair.admit(1, 3 * MIB, now=0.0) == 0.0
    fair.release(1)
    assert fair.admit(1, MIB, now=0.0) == pytest.approx(3.0)  # 2 MiB owed + 1 MiB needed, at 1 MiB/s


def test_a_release_without_an_admission_changes_nothing_and_bad_shares_are_refused():
    fair = shares()
    fair.release(9)
    assert fair.admit(9, 100, now=0.0) == 0.0
    with pytest.raises(ValueError):
        Shares(node_inflight=0, node_bytes_per_s=1, node_burst_bytes=1)
    with pytest.raises(ValueError):
        Shares(node_inflight=1, node_bytes_per_s=0, node_burst_bytes=1)


def test_a_node_with_all_its_batches_in_flight_is_recognised_by_its_credential_key():
    fair = shares()
    assert not fair.busy("lsn_AAAAAAAAAAAA")  # never admitted: not known, not refused early
    assert fair.admit(1, 100, now=0.0, key="lsn_AAAAAAAAAAAA") == 0.0
    assert fair.busy("lsn_AAAAAAAAAAAA") and not fair.busy("lsn_BBBBBBBBBBBB")
    fair.release(1)
    assert not fair.busy("lsn_AAAAAAAAAAAA")
