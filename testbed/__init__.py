"""Lockstep testbed: emulated clusters in network namespaces, fault injection, agents.

The Python API is `Fabric` (see `testbed.fabric`); `generate` builds rail-optimized
topologies; `netns_problem()` says why the emulator cannot run here (None when it can).
The simulated large fabrics live in `testbed.simulate`.
"""

from .fabric import Fabric, default_base_dir, load_topology
from .netops import TestbedError, netns_problem
from .plan import PlanError, build_plan
from .topogen import generate

__all__ = ["Fabric", "PlanError", "TestbedError", "build_plan", "default_base_dir", "generate",
           "load_topology", "netns_problem"]
