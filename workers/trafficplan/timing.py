"""When the audit's load starts and how long it runs. Pure.

Every agent starts its flows at one instant of *cluster time* (its clock-sync clock), so the
start is as common as the clocks are synchronized — but only if every agent has its command
before that instant. The console plans the instant with a lead that grows with the number of
hosts (it issues one command per host, and each agent must poll, claim and start it) and with
the worst command delivery it just saw in the audit's node phase. An agent that still starts
late costs only its own pairs' first windows (``windows.combine_measured``); the load runs long
enough past the measured span that an agent late by up to ``late_allowance_s`` is still measured
for the whole span. A later one: its pairs are not measured, never passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LEAD_BASE_S = 2.0  # an agent's poll, claim and thread start on an idle host
LEAD_PER_HOST_S = 0.25  # the console issues one command per host, the agents poll one console
DELIVERY_FACTOR = 2.0  # the node phase's worst delivery, with room for a slower second one
MAX_LEAD_S = 60.0
LATE_MIN_S = 2.0


@dataclass(frozen=True)
class LoadTiming:
    lead_s: float  # from the plan to the common start (cluster time)
    duration_s: float  # how long the agents load: the measured span plus the late allowance
    late_allowance_s: float  # how late an agent may start and still be measured for the whole span
    min_windows: int  # windows a pair needs to count as measured

    def to_dict(self) -> dict:
        return {"lead_s": self.lead_s, "duration_s": self.duration_s, "late_allowance_s": self.late_allowance_s,
                "min_windows": self.min_windows}


def load_timing(hosts: int, worst_delivery_s: float | None, *, lead_min_s: float, measure_s: float,
                window_s: float = 1.0) -> LoadTiming:
    """The load's lead and duration for `hosts` agents (see the module docstring).

    `worst_delivery_s`: the longest a node-phase command took from issue to claim (None: unknown);
    `lead_min_s`: the operator's minimum lead; `measure_s`: the span every pair must be measured over.
    """
    if hosts < 1 or lead_min_s <= 0 or measure_s <= 0 or window_s <= 0:
        raise ValueError("hosts, lead_min_s, measure_s and window_s must be positive")
    delivery = max(0.0, worst_delivery_s or 0.0)
    lead = max(lead_min_s, LEAD_BASE_S + LEAD_PER_HOST_S * hosts, LEAD_BASE_S + DELIVERY_FACTOR * delivery)
    lead = min(MAX_LEAD_S, max(lead_min_s, lead))
    min_windows = max(1, math.ceil(measure_s / window_s - 1e-9))
    # an agent late by L loses windows up to ceil(L / window): the allowance is whole windows
    allowance = math.ceil(max(LATE_MIN_S, lead / 2) / window_s - 1e-9) * window_s
    return LoadTiming(round(lead, 3), round(min_windows * window_s + allowance, 3), round(allowance, 3), min_windows)
