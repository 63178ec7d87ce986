"""The ``probe.mesh`` activity: the runner under the agent's supervisor.

Started, re-planned and stopped by ``activity.set`` (``{"name": "probe.mesh", "args": PLAN}``);
a re-plan is applied in place by the running engine. A crash of the engine (the helper exits)
crashes the loop, and the supervisor restarts it with backoff, reporting the error.
"""

from __future__ import annotations

import time

from agent.activities import activity
from agent.probemesh import plan
from agent.probemesh.runner import MeshRunner

STATUS_EVERY_S = 1.0


@activity("probe.mesh", args=plan.ARGS, check=plan.check, stall_after_s=30,
          description="Probe the peers of the plan from every NIC, answer their probes, and send loss and "
                      "one-way delay per pair, direction and window (probe.window telemetry).")
def probe_mesh(ctx) -> None:
    runner = MeshRunner(ctx.emit, ctx.services.get("cluster_clock"))
    try:
        runner.apply(ctx.plan)
        ctx.plan_changed()
        ctx.progress(**runner.status())
        reported = time.monotonic()
        while ctx.running():
            if ctx.plan_changed():
                runner.apply(ctx.plan)
            runner.step(0.1)
            if time.monotonic() - reported >= STATUS_EVERY_S:
                ctx.progress(**runner.status())
                reported = time.monotonic()
    finally:
        runner.close()
