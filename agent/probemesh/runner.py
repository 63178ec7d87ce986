"""The probe mesh's shell: a plan in, an engine running it, ``probe.window`` records out.

Shared by the ``probe.mesh`` activity and ``python -m agent.probemesh run``. It picks the engine
(the native helper when built, else the Python engine, degraded and saying so), hands it the
cluster clock's offset, drives path discovery, and turns window events into records.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from agent import log as agentlog
from agent.clusterclock import ClusterClock
from agent.probemesh.native import EngineError, NativeEngine, find_helper
from agent.probemesh.paths import PathDiscovery
from agent.probemesh.plan import EngineConfig, engine_config
from agent.probemesh.pyengine import PythonEngine
from agent.probemesh.windows import record

CLOCK_EVERY_S = 0.1


class MeshRunner:
    def __init__(self, emit: Callable[[str, dict], None], clock: ClusterClock | None = None,
                 monotonic: Callable[[], float] = time.monotonic):
        self.emit = emit
        self.clock = clock
        self.monotonic = monotonic
        self.engine: NativeEngine | PythonEngine | None = None
        self.cfg: EngineConfig | None = None
        self.paths = PathDiscovery({}, {})
        self.helper_stats: dict = {}
        self.nic_state: list[dict] = []
        self.errors: list[str] = []
        self.windows = 0
        self.records_refused = 0
        self._clock_at = 0.0
        self._last_clock: tuple[int, bool] | None = None
        self._cpu: tuple[float, int] | None = None
        self.cpu_cores: float | None = None

    # -- plan ----------------------------------------------------------------------------------
    def apply(self, plan: dict) -> None:
        """Start, or re-plan in place (the engine keeps what did not change)."""
        cfg = engine_config(plan)
        wanted = plan.get("engine", "auto")
        if self.engine is not None and self.engine.kind != self._engine_kind(wanted):
            self.engine.close()
            self.engine = None
        if self.engine is None:
            self.engine = self._new_engine(wanted)
            self._last_clock = None
        self.cfg = cfg
        self.paths.configure(cfg)
        self._push_clock(force=True)
        self.engine.apply(cfg)
        agentlog.info("probemesh.plan", engine=self.engine.kind, nics=len(cfg.nics), peers=len(cfg.peers),
                      rate=round(cfg.rate), sport_count=cfg.sport_count, degraded=self.engine.degraded)

    @staticmethod
    def _engine_kind(wanted: str) -> str:
        if wanted == "auto":
            return "native" if find_helper() is not None else "python"
        return wanted

    def _new_engine(self, wanted: str):
        kind = self._engine_kind(wanted)
        missing = None
        if kind == "native":
            try:
                return NativeEngine()
            except EngineError as exc:
                if wanted == "native":
                    raise  # asked for by name: the activity backs off and says why
                missing = str(exc)
        engine = PythonEngine()
        if wanted == "auto":
            engine.missing = missing or "the native helper lockstep-probed is not built (make native)"
        return engine

    # -- the loop --------------------------------------------------------------------------------
    def step(self, timeout: float = 0.1) -> None:
        """Run for up to `timeout` s: engine events, records, path discovery, the clock."""
        engine = self.engine
        if engine is None:
            time.sleep(timeout)
            return
        # what the engine has already said comes first: after a stall of this process, answers
        # waiting in the pipe must not be taken for traces that timed out
        for ev in engine.events(timeout):
            self._handle(ev)
        self._push_clock()
        engine.traces(self.paths.due(self.monotonic()))

    def _handle(self, ev: dict) -> None:
        kind = ev.get("ev")
        now = self.monotonic()
        if kind == "window":
            self._window(ev, now)
        elif kind == "hop":
            self.paths.on_hop(ev, now)
        elif kind == "stats":
            self.helper_stats = {k: v for k, v in ev.items() if k != "ev"}
            cpu = ev.get("cpu_ns")
            if isinstance(cpu, int):
                if self._cpu is not None and now > self._cpu[0]:
                    self.cpu_cores = round((cpu - self._cpu[1]) / 1e9 / (now - self._cpu[0]), 4)
                self._cpu = (now, cpu)
        elif kind == "config":
            self.nic_state = ev.get("nics", [])
            errors = [f"{self.cfg.nics[n['i']].name}: {n['errors']}" for n in self.nic_state
                      if n.get("errors") and self.cfg and n["i"] < len(self.cfg.nics)]
            self.errors = errors[:8]
            for e in errors:
                agentlog.warning("probemesh.nic", error=e)
        elif kind == "error":
            self.errors = (self.errors + [str(ev.get("msg"))])[-8:]
            agentlog.error("probemesh.engine_error", error=ev.get("msg"))

    def _window(self, ev: dict, now: float) -> None:
        cfg = self.cfg
        if cfg is None or not 0 <= ev.get("nic", -1) < len(cfg.nics):
            return
        interval = getattr(self.engine, "interval_ns", None) if self.engine.kind == "python" else None
        data, lossy = record(ev, cfg, self.engine.kind, self.paths, interval)
        for peer_i, sports in lossy:
            nic_i, peer, addr = cfg.peers[peer_i]
            self.paths.mark_lossy(cfg.nics[nic_i].name, peer, addr, sports, now)
        try:
            self.emit("probe.window", data)
            self.windows += 1
        except ValueError as exc:  # too large for the telemetry buffer: said, counted
            self.records_refused += 1
            agentlog.error("probemesh.record_refused", error=str(exc), nic=data["nic"])

    def _push_clock(self, force: bool = False) -> None:
        if self.engine is None or self.clock is None:
            return
        now = self.monotonic()
        if not force and now - self._clock_at < CLOCK_EVERY_S:
            return
        self._clock_at = now
        t = self.clock.now()
        state = (int(t.offset_ns), bool(t.synced))
        if force or state != self._last_clock:
            self.engine.set_clock(*state)
            self._last_clock = state

    # -- health ----------------------------------------------------------------------------------
    def status(self) -> dict:
        engine = self.engine
        cfg = self.cfg
        out: dict = {"engine": engine.kind if engine else None}
        if engine is not None and engine.kind == "native":
            out["helper_pid"] = engine.pid
        if engine is not None and engine.kind == "python":
            reasons = [r for r in (getattr(engine, "missing", None), engine.degraded) if r]
            out["degraded"] = "; ".join(reasons) or "python engine (asked for)"
            out["rate_cap"] = engine.rate_cap
        if cfg is not None:
            interval = getattr(engine, "interval_ns", cfg.interval_ns) if engine and engine.kind == "python" \
                else cfg.interval_ns
            out.update(nics=len(cfg.nics), peers=len(cfg.peers), interval_ms=interval / 1e6,
                       rate=round(len(cfg.peers) * 1e9 / interval), sport_count=cfg.sport_count)
        st = self.helper_stats
        if st:
            out.update({k: st.get(k) for k in ("sent", "echoes", "answered_probes", "send_errors", "skipped",
                                                "windows_skipped", "out_dropped")})
        out["windows"] = self.windows
        if self.cpu_cores is not None:
            out["cpu_cores"] = self.cpu_cores
        out["paths"] = self.paths.stats()
        if self.nic_state:
            out["hw_timestamps"] = sum(1 for n in self.nic_state if n.get("hw"))
            down = [self.cfg.nics[n["i"]].name for n in self.nic_state
                    if self.cfg and n["i"] < len(self.cfg.nics) and not (n.get("responder") and n.get("probing"))]
            if down:
                out["nics_not_running"] = down[:8]
        if self.errors:
            out["errors"] = [e[:160] for e in self.errors[-3:]]
        if self.records_refused:
            out["records_refused"] = self.records_refused
        return out

    def routes(self) -> list[dict]:
        """Every flow's learned path: nic, peer, sport (the port number), hops, path/devices when mapped."""
        first = self.cfg.sport_first if self.cfg else 0
        return [{"nic": nic, "peer": peer, "peer_address": addr, "sport": first + s, **route.to_json()}
                for (nic, peer, addr, s), route in sorted(self.paths.routes.items())]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


__all__ = ["EngineError", "MeshRunner"]
