"""The incident tracker (workers.incidents): hysteresis before opening, one incident per fault
across windows, resolving after clean windows, a flap reopening its incident, one-offs forgotten."""

from __future__ import annotations

import pytest

from workers.incidents import Hysteresis, step

S = 10**9
LINK = {"kind": "link", "name": "L1", "confidence": 0.6}
CONFIDENT = {"kind": "switch", "name": "leaf-0", "confidence": 0.95}


def run(windows, settings=None):
    state, out = None, []
    for i, culprits in enumerate(windows):
        state, actions = step(state, i * S, culprits, settings)
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


def test_it_resolves_after_the_clean_windows_and_not_before():
    windows = [[LINK], [LINK]] + [[]] * 5
    _, out = run(windows, Hysteresis(clear_windows=5))
    assert out[2:6] == [[]] * 4 and out[6] == [("resolve", "link:L1")]


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


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="open_windows"):
        Hysteresis(open_windows=4, open_span=3)
