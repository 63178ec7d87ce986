"""Clock sync on the node: coded probes, per-pair estimation, the cluster clock.

- :mod:`agent.clocksync.trace` — the ``lockstep.clocktrace/v1`` document, validated into arrays;
- :mod:`agent.clocksync.fit` — the per-pair estimator (``estimate(trace) -> Estimate``);
- :mod:`agent.clocksync.estimate` — its command line (``python -m agent.clocksync.estimate``);
- :mod:`agent.clocksync.clock` — ``ClockSource`` (every timestamp, with the test-only virtual
  clock) and ``ClusterClock`` (local → cluster time);
- :mod:`agent.clocksync.probe` — the coded-probe prober and responder (UDP, SO_TIMESTAMPING).
"""

import os

# The fits are small (a few thousand points, a dozen parameters): BLAS threads only contend with
# the node's real work, and on a busy machine they make L-BFGS-B's tiny vector ops many times
# slower. Must be set before numpy is first imported; an explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
