"""Incident tracking: a cluster's verdicts, window after window, into incidents that open, update
and resolve (see `tracker`), each verdict judged on the evidence of a span of consecutive windows
(see `evidence`). Pure: state in, state and actions out; time is the windows' own."""

from workers.incidents.evidence import windows_for
from workers.incidents.tracker import Action, Hysteresis, Span, culprit_key, step

__all__ = ["Action", "Hysteresis", "Span", "culprit_key", "step", "windows_for"]
