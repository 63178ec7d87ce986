"""How many consecutive short windows make one evidence span (pure).

A window short enough to name a dark cable within a few hundred milliseconds holds few probes
per pair: a cable losing 5 % of them loses one or two per pair and window, which one window
alone may not tell from a burst. The console judges each window on itself and the windows just
before it, about `evidence_s` in all, so a fault's evidence grows window by window instead of
restarting at every window boundary; the records of the span are merged into one set of pairs
by `workers.probemesh.merge_records` (counts added up, delays weighted by their samples).
"""

from __future__ import annotations


def windows_for(evidence_s: float, window_s: float) -> int:
    """How many consecutive windows of `window_s` make a span of about `evidence_s` (at least 1)."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, got {window_s!r}")
    return max(1, round(evidence_s / window_s))
