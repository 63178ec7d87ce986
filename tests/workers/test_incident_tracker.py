"""The incident tracker (workers.incidents): a confident culprit opens at once, a doubtful one on
evidence that does not overlap, one incident per fault across windows, resolving after a clean
time, a flap reopening its incident, one-offs forgotten; verdicts of overlapping spans of short
windows count as one piece of evidence."""

from __future__ import annotations

import pytest

from workers.incidents import Hysteresis, Span, step

S = 10**9
Q = S // 4  # a 250 ms window
LINK = {"kind": "link", "name": "L1", "confidence": 0.6}
CONFIDENT = {"kind": "switch", "name": "leaf-0", "confidence": 0.95}


def run(windows, settings=None, length=S, spanned=1):
    """Windows of `length`, each judged on itself and the `spanned - 1` before it."""
    state, out = None, []
    for i, culprits in enumerate(windows):
        judged = Span(i * length, (i + 1) * length, max(0, i - spanned + 1) * length)
        state, actions = step(state, judged, culprits, settings)
        out.append([(a.action, a.key) for a in actions])
    return state, out


def test_a_doubtful_culprit_opens_on_its_second_window_and_then_updates():
    _, out = run([[LINK], [LINK], [LINK]])
    assert out == [[], [("open", "link:L1")], [("update", "link:L1")]]


def test_a_confident_culprit_opens_at_once():
    _, out = run([[CONFIDENT]])
    assert out == [[("open", "switch:leaf-0")]]


def test_two_of_three_windows_open_it_and_a_one_off_is_forgotten():
    state, out = run([[LINK], [], [LINK]])
    assert out[-1] == [("open", "link:L1")]
    state, out = run([[LINK], [], [], []])
    assert out == [[], [], [], []] and state["culprits"] == {}


def test_a_doubtful_culprit_of_overlapping_spans_waits_for_evidence_of_its_own():
    # 250 ms windows, each judged on the last four: the first four verdicts share the first
    # window, so a burst there would be in each of them; the fifth has none of it
    _, out = run([[LINK]] * 6, length=Q, spanned=4)
    assert out[:4] == [[]] * 4 and out[4] == [("open", "link:L1")] and out[5] == [("update", "link:L1")]


def test_a_confident_culprit_of_a_short_window_opens_at_once():
    _, out = run([[], [], [CONFIDENT]], length=Q, spanned=4)
    assert out == [[], [], [("open", "switch:leaf-0")]]


def test_a_host_that_stops_answering_for_a_moment_is_not_an_incident_and_one_that_stays_silent_is():
    host = {"kind": "host", "name": "node0003", "confidence": 1.0}
    _, out = run([[host], [host], [], [], []], length=Q * 2, spanned=2)  # a stall in one 500 ms window
    assert out == [[]] * 5
    _, out = run([[host]] * 4, length=Q * 2, spanned=2)
    assert out[:2] == [[], []] and out[2] == [("open", "host:node0003")]


def test_it_resolves_after_the_clean_time_and_not_before():
    windows = [[LINK], [LINK]] + [[]] * 5
    _, out = run(windows, Hysteresis(clear_s=5))
    assert out[2:6] == [[]] * 4 and out[6] == [("resolve", "link:L1")]
    # the same time in short windows: 20 clean windows of 250 ms after the last naming one
    windows = [[CONFIDENT]] * 4 + [[]] * 20
    _, out = run(windows, Hysteresis(clear_s=5), length=Q, spanned=4)
    assert all(acts == [] for acts in out[4:23]) and out[23] == [("resolve", "switch:leaf-0")]


def test_a_flap_stays_one_incident_and_a_return_after_resolving_reopens_it():
    flap = [[LINK], [LINK], [], [LINK], [], [LINK], []]
    _, out = run(flap)
    assert [a for acts in out for a in acts if a[0] != "update"] == [("open", "link:L1")]
    windows = [[LINK], [LINK]] + [[]] * 5 + [[LINK], [LINK]]
    _, out = run(windows)
    assert out[6] == [("resolve", "link:L1")] and out[8] == [("reopen", "link:L1")]


def test_a_return_long_after_resolving_is_a_new_incident():
    s = Hysteresis(reopen_s=3)
    windows = [[LINK], [LINK]] + [[]] * 10 + [[LINK], [LINK]]
    state, out = run(windows, s)
    assert out[-1] == [("open", "link:L1")] and state["resolved"] == {}


def test_several_culprits_are_tracked_apart():
    _, out = run([[LINK, CONFIDENT], [LINK], [LINK]])
    assert out[0] == [("open", "switch:leaf-0")] and out[1] == [("open", "link:L1")]


def test_an_open_culprit_of_a_state_stored_before_clears_and_other_entries_start_over():
    old = {"culprits": {"link:L1": {"hits": [1, 1, 1], "misses": 0, "open": True},
                        "link:L2": {"hits": [1], "misses": 0, "open": False}}, "resolved": {}}
    state, actions = step(old, Span(0, S), [])
    assert actions == [] and set(state["culprits"]) == {"link:L1"}
    acts = []
    for i in range(1, 6):
        state, actions = step(state, Span(i * S, (i + 1) * S), [])
        acts.append([(a.action, a.key) for a in actions])
    assert acts == [[], [], [], [("resolve", "link:L1")], []]  # 5 s after the first window it saw


def test_bad_settings_and_spans_are_refused():
    with pytest.raises(ValueError, match="confirm_spans"):
        Hysteresis(confirm_spans=0)
    with pytest.raises(ValueError, match="end_ns"):
        Span(S, S)
    with pytest.raises(ValueError, match="from_ns"):
        Span(S, 2 * S, 2 * S)
