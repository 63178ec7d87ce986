"""Probe planning: which peers every NIC probes (see `plan`).

API (what the console calls when the topology or the membership changes):

    plan = plan_probes(topology, seed=0, members=None, cross_leaf=8)   # ProbePlan
    plan.peers["node0000/nic0"]         # the NICs it probes
    plan.size(nic), plan.sizes(), plan.pairs(), plan.to_document()
    coverage_report(index, plan)        # smallest coverage per element kind
    ambiguous_groups(index, plan.pairs())  # elements the plan's probes cannot tell apart

Deterministic for a seed; a NIC joining or leaving changes only the choices involving it.
"""

from workers.probeplan.plan import (
    DEFAULT_COVERAGE,
    DEFAULT_CROSS_LEAF,
    ProbePlan,
    ambiguous_groups,
    coverage_report,
    plan_probes,
)

__all__ = ["DEFAULT_COVERAGE", "DEFAULT_CROSS_LEAF", "ProbePlan", "ambiguous_groups", "coverage_report", "plan_probes"]
