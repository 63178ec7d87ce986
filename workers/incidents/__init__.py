"""Incident tracking: a cluster's verdicts, window after window, into incidents that open, update
and resolve (see `tracker`). Pure: state in, state and actions out; time is the window's own."""

from workers.incidents.tracker import Action, Hysteresis, culprit_key, step

__all__ = ["Action", "Hysteresis", "culprit_key", "step"]
