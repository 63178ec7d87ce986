"""The clock source (with its test-only virtual clock) and the cluster clock built on it."""

from __future__ import annotations

import time

import pytest

from agent.clocksync.clock import (
    ENV_DRIFT,
    ENV_EPOCH,
    ENV_OFFSET,
    ClockConfigError,
    ClockSource,
    ClusterClock,
)


def test_without_test_variables_the_source_is_the_kernel_clock():
    source = ClockSource.from_env({})
    assert not source.virtual
    assert source.transform(1_800_000_000_123_456_789) == 1_800_000_000_123_456_789
    before = time.time_ns()
    now = source.now_ns()
    assert before <= now <= time.time_ns()


def test_the_virtual_clock_maps_every_timestamp_by_offset_and_drift_from_its_epoch():
    epoch = 1_800_000_000_000_000_000
    source = ClockSource.from_env({ENV_OFFSET: "-25000000", ENV_DRIFT: "40", ENV_EPOCH: str(epoch)})
    assert source.transform(epoch) == epoch - 25_000_000
    # 10 s later the clock has gained 40 ppm × 10 s = 400 µs, exactly, in integer ns.
    assert source.transform(epoch + 10 * 10**9) == epoch + 10 * 10**9 - 25_000_000 + 400_000
    other = ClockSource(offset_ns=1000, drift_ppm=-10.0, epoch_ns=epoch)
    assert source.true_offset_ns(other, epoch + 10**9) == pytest.approx(1000 - 10_000 + 25_000_000 - 40_000)


@pytest.mark.parametrize(("env", "named"), [
    ({ENV_OFFSET: "12ms"}, ENV_OFFSET), ({ENV_DRIFT: "fast"}, ENV_DRIFT), ({ENV_EPOCH: "1.5e18"}, ENV_EPOCH),
    ({ENV_OFFSET: str(2 * 3600 * 10**9)}, ENV_OFFSET), ({ENV_DRIFT: "5000"}, ENV_DRIFT), ({ENV_DRIFT: "nan"}, ENV_DRIFT),
])
def test_malformed_test_clock_variables_are_refused_by_name(env, named):
    with pytest.raises(ClockConfigError, match=named):
        ClockSource.from_env(env)


def test_the_cluster_clock_applies_the_published_offset_and_drift():
    source = ClockSource(offset_ns=0, drift_ppm=0.0, epoch_ns=0)
    clock = ClusterClock(source, stale_after_s=30)
    assert not clock.synced()
    assert clock.now()["sigma_ns"] is None
    t_ref = time.time_ns()
    clock.update(offset_ns=2_000_000.0, drift_ppm=10.0, sigma_ns=45.0, t_ref_ns=t_ref, reference="node0000")
    local = t_ref + 5 * 10**9
    assert clock.to_cluster(local) == local - 2_000_000 - 50_000
    assert clock.to_local(clock.to_cluster(local)) == local
    assert clock.synced(t_ref) and not clock.synced(t_ref + 31 * 10**9)
    reply = clock.time_reply(7)
    assert reply["v"] == 1 and reply["id"] == 7 and reply["ok"] is True and reply["synced"] is True
    assert reply["sigma_ns"] == 45.0 and reply["drift_ppm"] == 10.0
    assert abs(reply["cluster_time_ns"] - (time.time_ns() + reply["offset_ns"])) < 50_000_000


def test_cluster_time_is_the_local_sockets_provider_reading():
    clock = ClusterClock(ClockSource(), stale_after_s=30)
    clock.update(offset_ns=1000.0, drift_ppm=0.0, sigma_ns=20.0, t_ref_ns=time.time_ns())
    reading = clock.cluster_time()
    # This clock runs 1,000 ns ahead of the reference: cluster time − local time is −1,000 ns.
    assert reading.synced is True and reading.offset_ns == -1000.0 and reading.sigma_ns == 20.0
    assert abs(reading.cluster_time_ns - reading.offset_ns - time.time_ns()) < 50_000_000


def test_the_reference_node_is_synced_with_zero_offset():
    clock = ClusterClock(ClockSource(), is_reference=True)
    assert clock.synced()
    local = time.time_ns()
    assert clock.to_cluster(local) == local


def test_one_way_delays_come_from_both_ends_cluster_clocks():
    epoch = time.time_ns()
    sender_src = ClockSource(offset_ns=5_000_000, drift_ppm=20.0, epoch_ns=epoch)
    receiver_src = ClockSource(offset_ns=-3_000_000, drift_ppm=-10.0, epoch_ns=epoch)
    sender, receiver = ClusterClock(sender_src), ClusterClock(receiver_src)
    # Each has learnt its exact offset and drift to the reference (real time here) at the epoch.
    sender.update(5_000_000, 20.0, 30.0, t_ref_ns=sender_src.transform(epoch))
    receiver.update(-3_000_000, -10.0, 40.0, t_ref_ns=receiver_src.transform(epoch))
    sent_real = epoch + 2 * 10**9
    tx_cluster = sender.to_cluster(sender_src.transform(sent_real))
    delay, sigma = receiver.one_way_delay_ns(tx_cluster, receiver_src.transform(sent_real + 7_500), tx_sigma_ns=30.0)
    assert abs(delay - 7_500) <= 2
    assert sigma == pytest.approx(50.0)
