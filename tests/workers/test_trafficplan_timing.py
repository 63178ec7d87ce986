"""The load's lead and duration (workers.trafficplan.timing)."""

from __future__ import annotations

import pytest

from workers.trafficplan.timing import LATE_MIN_S, LEAD_BASE_S, LEAD_PER_HOST_S, MAX_LEAD_S, load_timing


def test_the_lead_grows_with_the_hosts_and_the_node_phases_delivery():
    small, large = (load_timing(h, None, lead_min_s=1.0, measure_s=4.0) for h in (4, 64))
    assert small.lead_s == LEAD_BASE_S + 4 * LEAD_PER_HOST_S and large.lead_s == LEAD_BASE_S + 64 * LEAD_PER_HOST_S
    slow = load_timing(4, 9.0, lead_min_s=1.0, measure_s=4.0)
    assert slow.lead_s == LEAD_BASE_S + 2 * 9.0  # the delivery just seen, with room for a slower one
    assert load_timing(4, None, lead_min_s=12.0, measure_s=4.0).lead_s == 12.0  # the operator's minimum
    assert load_timing(4, 500.0, lead_min_s=1.0, measure_s=4.0).lead_s == MAX_LEAD_S


def test_the_load_outlasts_the_measured_span_by_the_late_allowance_in_whole_windows():
    t = load_timing(32, None, lead_min_s=5.0, measure_s=4.0, window_s=1.0)
    assert t.lead_s == 10.0 and t.late_allowance_s == 5.0 and t.duration_s == 9.0 and t.min_windows == 4
    short = load_timing(1, None, lead_min_s=1.0, measure_s=2.5, window_s=1.0)
    assert short.late_allowance_s == LATE_MIN_S and short.min_windows == 3 and short.duration_s == 5.0
    # an agent late by up to the allowance still has min_windows whole windows
    late = t.late_allowance_s
    assert t.duration_s / 1.0 - -(-late // 1.0) >= t.min_windows


def test_bad_arguments_are_refused():
    for kwargs in ({"hosts": 0}, {"lead_min_s": 0}, {"measure_s": -1}, {"window_s": 0}):
        args = {"hosts": 4, "worst_delivery_s": None, "lead_min_s": 5.0, "measure_s": 4.0} | kwargs
        with pytest.raises(ValueError):
            load_timing(args.pop("hosts"), args.pop("worst_delivery_s"), **args)
