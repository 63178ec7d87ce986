"""The ``clock.sync`` activity: probe the planned peers, estimate each pair, serve cluster time.

Started, re-planned and stopped by ``activity.set`` (``{"name": "clock.sync", "args": PLAN}``,
the plan in :mod:`agent.clocksync.plan`). Every ``window_s`` it estimates the pairs it owns
(the per-pair estimator over the last window of coded probes) and emits one ``clock.estimate``
record per window — the aggregate, never the probes. The console solves the cluster's graph
and sends this node's correction back in a re-plan; from then on the local socket's ``time``
op answers cluster time from it (``ctx.services["cluster_clock"].provide``), ``synced`` while
the correction is fresher than ``STALE_AFTER_S``.

The estimator needs numpy and scipy (the agent package's ``clocksync`` variant); without them
the loop fails with a sentence saying so, and the supervisor reports it in the heartbeat.
"""

from __future__ import annotations

import time

from agent import log as agentlog
from agent.activities import activity
from agent.clocksync import plan as clockplan

ESTIMATE_KIND = "clock.estimate"
ESTIMATE_FORMAT = "lockstep.clock.estimate/v1"
STALE_AFTER_S = 60.0  # a correction older than this no longer counts as synced
MIN_PROBES = 50  # a window with fewer complete packets with a peer is not estimated


def _bind(plan: dict) -> tuple:
    return plan["address"], plan["port"], plan["interface"]


class ClockSync:
    """The prober, the estimator and the cluster clock of one plan (re-planned in place)."""

    def __init__(self, emit, socket_clock, source=None) -> None:
        try:
            from agent.clocksync.clock import ClockSource, ClusterClock
            from agent.clocksync.fit import EstimateError, estimate
            from agent.clocksync.trace import TraceError, parse_trace
        except ImportError as exc:
            raise RuntimeError(f"clock sync needs numpy and scipy (install lockstep-agent[clocksync]): {exc}") from None
        self._estimate, self._parse, self._errors = estimate, parse_trace, (EstimateError, TraceError)
        self.emit = emit
        self.socket_clock = socket_clock
        self.source = source or ClockSource.from_env()  # the test-only virtual clock, when set
        self.clock = ClusterClock(self.source, stale_after_s=STALE_AFTER_S)
        self.prober = None
        self.plan: dict | None = None
        self.windows = 0
        self.estimates = 0
        self.failed = 0
        self.last_error: str | None = None
        self.correction_at: int | None = None

    def apply(self, plan: dict) -> None:
        from agent.clocksync.probe import ClockProber, interface_of

        peers = {name: (address, plan["port"]) for name, address in plan["peers"]}
        if self.prober is not None and (self.plan is None or _bind(self.plan) != _bind(plan)
                                        or self.plan["rate_hz"] != plan["rate_hz"]):
            self.prober.stop()
            self.prober = None
        if self.prober is None and plan["address"]:
            interface = plan["interface"] or interface_of(plan["address"])
            self.prober = ClockProber(plan["name"], plan["address"], plan["port"], peers, interface=interface,
                                      source=self.source, rate_hz=plan["rate_hz"]).start()
        elif self.prober is not None:
            self.prober.set_peers(peers)
        corr = plan["correction"]
        if corr is not None:  # every correction the console sends is fresh, even one equal to the last
            self.clock.update(corr["offset_ns"], corr["drift_ppm"], corr["sigma_ns"], corr["t_ref_ns"],
                              corr["reference"])
            self.correction_at = self.source.now_ns()
        if self.socket_clock is not None:
            self.socket_clock.provide(self.clock if corr is not None else None)
        self.plan = plan

    def window(self) -> dict | None:
        """Estimate the pairs this node owns over the last window; the record, or None without a prober."""
        plan = self.plan
        if self.prober is None or plan is None:
            return None
        t_ref = self.source.now_ns()
        pairs, failed = [], []
        for peer in self.prober.peers():
            if not clockplan.estimated_by_me(plan["name"], peer):
                continue
            doc = self.prober.trace(peer, plan["window_s"], t_ref)
            if len(doc["probes"]) < MIN_PROBES:
                failed.append({"peer": peer, "error": f"{len(doc['probes'])} complete packets in the window"})
                continue
            try:
                est = self._estimate(self._parse(doc))
            except self._errors as exc:
                failed.append({"peer": peer, "error": str(exc)[:200]})
                continue
            pairs.append({"peer": peer, "offset_ns": round(est.offset_ns, 3), "drift_ppm": round(est.drift_ppm, 6),
                          "sigma_ns": round(max(est.sigma_ns, 0.5), 3), "min_owd_ns": round(est.min_owd_ns, 3),
                          "probes_used": int(est.probes_used)})
        self.windows += 1
        self.estimates += len(pairs)
        self.failed += len(failed)
        self.last_error = failed[-1]["error"] if failed else None
        now = self.clock.now()
        return {"format": ESTIMATE_FORMAT, "node": plan["name"], "t_ref_ns": t_ref, "window_s": plan["window_s"],
                "timestamping": self.prober.mode, "pairs": pairs, "failed": failed,
                "synced": bool(now["synced"]), "applied_offset_ns": round(float(now["offset_ns"]), 3),
                "applied_sigma_ns": now["sigma_ns"]}

    def status(self) -> dict:
        out = {"windows": self.windows, "estimates": self.estimates, "failed": self.failed,
               "peers": len(self.plan["peers"]) if self.plan else 0, "synced": self.clock.synced()}
        if self.prober is not None:
            st = self.prober.stats
            out.update(timestamping=self.prober.mode, sent=st.sent, received=st.received,
                       cpu_s=round(st.cpu_s, 3))
        if self.last_error:
            out["last_error"] = self.last_error
        return out

    def close(self) -> None:
        if self.socket_clock is not None:
            self.socket_clock.provide(None)
        if self.prober is not None:
            self.prober.stop()
            self.prober = None


@activity("clock.sync", args=clockplan.ARGS, check=clockplan.check, stall_after_s=60,
          description="Probe the planned peers with coded probes, estimate each pair's offset and drift "
                      "(clock.estimate telemetry, one record per window), apply the console's correction "
                      "and serve cluster time on the local socket.")
def clock_sync(ctx) -> None:
    sync = ClockSync(ctx.emit, ctx.services.get("cluster_clock"))
    try:
        sync.apply(ctx.plan)
        ctx.plan_changed()
        ctx.progress(**sync.status())
        next_window = time.monotonic() + sync.plan["window_s"]
        while ctx.running():
            if not ctx.sleep(max(0.0, next_window - time.monotonic())):
                break
            if ctx.plan_changed():
                sync.apply(ctx.plan)
            if time.monotonic() < next_window:
                continue  # woken early by a re-plan
            next_window = time.monotonic() + sync.plan["window_s"]
            record = sync.window()
            if record is not None and (record["pairs"] or record["failed"]):
                try:
                    ctx.emit(ESTIMATE_KIND, record)
                except ValueError as exc:  # too large for the buffer: said, not fatal
                    agentlog.error("clocksync.record_refused", error=str(exc))
            ctx.progress(**sync.status())
    finally:
        sync.close()
